"""The engine the offline commands (``explain``, ``generate``) build: their shared flags, checked against vLLM's types.

``serve`` hands its ``--enable-eplb`` / ``--eplb-config`` over the same way
(:func:`eplb_request`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ascend_kernel.cli.arg_types import (
    SEED,
    capture_sizes,
    engine_pair,
    graph_mode_name,
    json_object,
    model_dir,
    whole_number,
)
from ascend_kernel.errors import UsageError


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=model_dir, help="local model directory")
    p.add_argument("--dtype", default=None,
                   help="vLLM's dtype (checked against vLLM's choices); default float32, or bfloat16 for a quantized "
                   "checkpoint (vLLM-CPU's int8 kernels take bfloat16/float16 activations)")
    p.add_argument("--quantization", metavar="NAME",
                   help="checkpoint quantization format for vLLM (ascend: msModelSlim's, found without this flag "
                   "when quant_model_description.json is present; compressed-tensors is read from config.json)")
    p.add_argument("--max-model-len", type=whole_number(1), default=512)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--additional-config", type=json_object('\'{"ascend_kernel": {"sampler": "vllm-default"}}\''),
                   help="JSON for vLLM's additional_config (e.g. '{\"ascend_kernel\": {...}}')")
    p.add_argument("--speculative-config", type=json_object('\'{"method": "ngram", "num_speculative_tokens": 2}\''),
                   help="JSON for vLLM's speculative_config")
    p.add_argument("--graph-mode", metavar="NAME", type=graph_mode_name,
                   help="graph-capture mode (eager, cpu-graph, aclgraph; `ascend-kernel plugins` lists them); "
                   "a capturing mode turns enforce_eager off")
    p.add_argument("--capture-sizes", metavar="1,2,4,8", type=capture_sizes,
                   help="batch sizes (tokens) the graph mode captures; larger batches run eagerly")
    p.add_argument("--graph-capture-mode", choices=("piecewise", "full_decode_only"),
                   help="what the graph mode captures: pieces between attention calls (every batch up to the "
                   "largest size), or whole uniform decode batches with attention inside (prefills run eagerly)")
    p.add_argument("--engine-arg", action="append", metavar="KEY=VALUE", type=engine_pair,
                   help="any other vLLM engine argument (value parsed as JSON when possible, checked against "
                   "vLLM's type for KEY before the engine starts); repeatable")


def engine_request(args: argparse.Namespace, kernel: bool):
    """The engine to build, every keyword checked against vLLM's types (imports vLLM; no engine starts)."""
    from ascend_kernel.cli import engine_args
    from ascend_kernel.cli.engine import EngineRequest
    from ascend_kernel.settings import load_settings

    dtype_arg = args.dtype if args.dtype is not None else default_dtype(args)
    given = {"dtype": engine_args.Given(f"--dtype {dtype_arg!r}", dtype_arg, dtype_arg)}
    if args.quantization is not None:
        given["quantization"] = engine_args.Given(f"--quantization {args.quantization!r}", args.quantization,
                                                  args.quantization)
    for key, value, flag in (("additional_config", args.additional_config, "--additional-config"),
                             ("speculative_config", args.speculative_config, "--speculative-config")):
        if value is not None:
            given[key] = engine_args.Given(f"{flag} {json.dumps(value)!r}", value)
    for key, text in args.engine_arg or []:
        given[key] = engine_args.Given(f"--engine-arg {key}={text!r}", engine_args.decode(text), text)
    if getattr(args, "lora", None):  # a slot per adapter, so base and every adapter share each batch
        given.setdefault("enable_lora", engine_args.Given("--lora", True))
        given.setdefault("max_loras", engine_args.Given("--lora", len(args.lora)))
    if kernel:  # names the plugins register with vLLM (--quantization ascend) before vLLM's types are read
        from ascend_kernel import kernel as kernel_mod

        kernel_mod.pre_register()
    extra = engine_args.check(given, engine_args.keyword_types())
    enforce_eager = graph_request(args, extra, kernel)
    if kernel:
        eplb_request(extra)
    if kernel:  # the kernel's own section of additional_config, before vLLM sees it
        load_settings(extra.get("additional_config"))
    dtype = extra.pop("dtype")
    return EngineRequest(model=args.model, kernel=kernel, dtype=dtype, max_model_len=args.max_model_len,
                         seed=args.seed, enforce_eager=enforce_eager, extra=extra)


def eplb_request(extra: dict[str, Any]) -> None:
    """``enable_eplb`` / ``eplb_config`` engine arguments into the EPLB plugin's settings, not vLLM's.

    vLLM's ParallelConfig refuses EPLB unless the platform is CUDA-alike or
    XPU, before any platform hook can speak; the EPLB plugin sets both fields
    on vLLM's config itself, as recorded config changes (plugins/eplb/admission.py).
    """
    if "enable_eplb" not in extra and "eplb_config" not in extra:
        return
    section = extra.setdefault("additional_config", {}).setdefault("ascend_kernel", {})
    if "enable_eplb" in extra:
        section["enable_eplb"] = bool(extra.pop("enable_eplb"))
    if "eplb_config" in extra:
        config = extra.pop("eplb_config")
        if not isinstance(config, dict):  # vLLM's EPLBConfig: its fields as given
            config = {k: v for k, v in vars(config).items() if not k.startswith("_")}
        section["eplb_config"] = config


#: a checkpoint file that marks an msModelSlim-quantized model (its int8 layers want bfloat16 activations)
QUANT_DESCRIPTION = "quant_model_description.json"


def default_dtype(args: argparse.Namespace) -> str:
    """float32 (what the tests' transformers oracle computes in), bfloat16 for a quantized checkpoint.

    vLLM-CPU's int8 GEMMs take bfloat16 or float16 activations only; in
    float32 a quantized model's int8 layers fall back to the seam's (slow)
    reference ops.
    """
    quantized = args.quantization is not None or (Path(args.model) / QUANT_DESCRIPTION).is_file() or \
        "quantization_config" in model_config(args.model)
    return "bfloat16" if quantized else "float32"


def model_config(model: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def graph_request(args: argparse.Namespace, extra: dict[str, Any], kernel: bool) -> bool:
    """``--graph-mode`` / ``--capture-sizes`` into the kernel's settings; returns the engine's enforce_eager.

    The offline commands run eagerly unless a graph mode that captures is
    asked for; ``enforce_eager`` given as an engine argument still wins (and
    a capturing mode then refuses it, naming the setting).
    """
    mode, sizes = getattr(args, "graph_mode", None), getattr(args, "capture_sizes", None)
    capture_mode = getattr(args, "graph_capture_mode", None)
    if sizes is not None and mode in (None, "eager"):
        raise UsageError("--capture-sizes needs --graph-mode with a mode that captures (e.g. cpu-graph)")
    if capture_mode is not None and mode in (None, "eager"):
        raise UsageError("--graph-capture-mode needs --graph-mode with a mode that captures (e.g. cpu-graph)")
    if mode is None:
        return True
    if not kernel:
        raise UsageError("--graph-mode chooses a kernel plugin; stock vLLM (--stock) has none "
                         "(use --engine-arg enforce_eager=false for stock vLLM's compilation)")
    section = extra.setdefault("additional_config", {}).setdefault("ascend_kernel", {})
    section["graph_mode"] = mode
    if sizes is not None:
        section["graph_capture_sizes"] = list(sizes)
    if capture_mode is not None:
        section["graph_capture_mode"] = capture_mode
    return mode == "eager"

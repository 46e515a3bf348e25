"""Building an offline vLLM engine for the CLI, with or without the kernel.

This is the one place the CLI touches process environment: vLLM reads its
knobs from the environment, and the platform is fixed when vLLM is first
imported, so the choice (kernel on CPU, kernel on NPU, or stock vLLM) is made
here before ``vllm`` is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

#: defaults that keep a tiny model quick on a CPU host (the user's env wins)
_VLLM_CPU_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                      "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class EngineRequest:
    model: str
    kernel: bool = True
    dtype: str = "float32"
    max_model_len: int = 512
    seed: int = 0
    enforce_eager: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def prepare_process(kernel: bool, offline_defaults: bool = True) -> str:
    """Choose the platform for this process before vLLM is imported; returns the device used.

    ``offline_defaults`` also sets the quick-tiny-model defaults of the
    offline commands (in-process engine, 1 GiB KV cache, no Hub access);
    ``serve`` leaves vLLM's own defaults.
    """
    from ascend_kernel.device import npu_available
    from ascend_kernel.settings import KernelSettings, load_settings

    for key, value in (_VLLM_CPU_DEFAULTS.items() if offline_defaults else ()):
        os.environ.setdefault(key, value)
    env = KernelSettings.env_name("device")
    if not kernel:
        os.environ[env] = "auto"  # the kernel stays off on a host without an NPU
        return "stock"
    device = load_settings().device  # validates every ASCEND_KERNEL_* value up front
    if device == "auto":
        device = "npu" if npu_available() else "cpu"
        os.environ[env] = device
    return device


def build_llm(request: EngineRequest) -> Any:
    from vllm import LLM

    kwargs = dict(model=request.model, dtype=request.dtype, max_model_len=request.max_model_len,
                  seed=request.seed, enforce_eager=request.enforce_eager)
    if "speculative_config" in request.extra:
        kwargs["disable_log_stats"] = False  # vLLM's spec-decode counters are stats (see spec_decode_counts)
    kwargs.update(request.extra)
    return LLM(**kwargs)


def kernel_report(llm: Any) -> dict[str, Any] | None:
    """The first worker's report, with every worker's step trace under ``ranks``; None without the kernel.

    Decisions are the same on every rank; what each rank did (tokens its MoE
    experts received, say) is not, so each rank's trace is kept.
    """
    try:
        reports = llm.collective_rpc("ascend_kernel_report")
    except Exception:  # noqa: BLE001 - stock vLLM workers have no such method
        return None
    return merge_worker_reports(reports)


def merge_worker_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The first worker's report plus every worker's step trace under ``ranks`` (also used by the server).

    Each entry names the worker by its rank in its engine and its engine's
    data-parallel rank (the server passes the workers of every DP engine).
    A worker with a KV connector also keeps its own ``kv_transfer`` counters
    there: at TP > 1 each rank moves its own heads' share of every page, so
    the top level (the first worker's) holds only that rank's bytes. Each
    entry also has its lm head's ``{tp_size, vocab_per_rank, bytes}`` (under
    lm-head TP each rank holds its own vocab shard).
    """
    report = dict(reports[0])
    report["ranks"] = [{"rank": r.get("rank", index), "dp_rank": r.get("dp_rank", 0), "trace": r["trace"],
                        **({"kv_transfer": r["kv_transfer"]} if r.get("kv_transfer") else {}),
                        **({"lm_head": r["layer_ops"]["lm_head"]} if (r.get("layer_ops") or {}).get("lm_head") else {})}
                       for index, r in enumerate(reports)]
    return report


#: vLLM's Prometheus counters of speculative decoding, by the key ``generate --json`` reports them under
SPEC_DECODE_METRICS = {"vllm:spec_decode_num_drafts": "num_drafts",
                       "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                       "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}


def spec_decode_counts(llm: Any) -> dict[str, int] | None:
    """vLLM's own speculative-decoding counters for this engine (None without speculation or stats)."""
    if getattr(llm.llm_engine, "vllm_config", None) is not None and \
            llm.llm_engine.vllm_config.speculative_config is None:
        return None
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - stats disabled: nothing to report
        return None
    counts = {key: 0 for key in SPEC_DECODE_METRICS.values()}
    found = False
    for metric in metrics:
        key = SPEC_DECODE_METRICS.get(metric.name)
        if key is not None:
            counts[key] += int(getattr(metric, "value", 0))
            found = True
    return counts if found else None


def shutdown(llm: Any) -> None:
    engine = getattr(llm, "llm_engine", None)
    for obj in (engine, getattr(engine, "engine_core", None)):
        stop = getattr(obj, "shutdown", None)
        if callable(stop):
            try:
                stop()
            except Exception:  # noqa: BLE001
                pass

"""Building an offline vLLM engine for the CLI, with or without the kernel.

This is the one place the CLI touches process environment: vLLM reads its
knobs from the environment, and the platform is fixed when vLLM is first
imported, so the choice (kernel on CPU, kernel on NPU, or stock vLLM) is made
here before ``vllm`` is imported.
"""

from __future__ import annotations

import json
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


def prepare_process(kernel: bool) -> str:
    """Choose the platform for this process before vLLM is imported; returns the device used."""
    from ascend_kernel.device import npu_available
    from ascend_kernel.settings import KernelSettings, load_settings

    for key, value in _VLLM_CPU_DEFAULTS.items():
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


def parse_engine_args(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are JSON when they parse as JSON, else strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"engine argument {pair!r} must look like key=value (value may be JSON)")
        try:
            out[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = raw
    return out


def build_llm(request: EngineRequest) -> Any:
    from vllm import LLM

    kwargs = dict(model=request.model, dtype=request.dtype, max_model_len=request.max_model_len,
                  seed=request.seed, enforce_eager=request.enforce_eager)
    kwargs.update(request.extra)
    return LLM(**kwargs)


def kernel_report(llm: Any) -> dict[str, Any] | None:
    """The kernel's report from the first worker, or None when the kernel is not active."""
    try:
        return llm.collective_rpc("ascend_kernel_report")[0]
    except Exception:  # noqa: BLE001 - stock vLLM workers have no such method
        return None


def shutdown(llm: Any) -> None:
    engine = getattr(llm, "llm_engine", None)
    for obj in (engine, getattr(engine, "engine_core", None)):
        stop = getattr(obj, "shutdown", None)
        if callable(stop):
            try:
                stop()
            except Exception:  # noqa: BLE001
                pass

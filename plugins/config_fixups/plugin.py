"""GPU-only vLLM options reset on NPU, each change recorded with its reason.

On an NPU these options either name NVIDIA/ROCm machinery (NVTX tracing,
FlashInfer, cuDNN, TRT-LLM, partial prefills tuned for ROCm) or a CPU-backend
knob; leaving them set would fail later, deep in a worker. On a CPU host the
kernel runs on vLLM's CPU platform and nothing here applies.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.config_changes import ConfigChange, change
from ascend_kernel.hookspecs import hookimpl

_ATTENTION_FLAGS_OFF = (
    "use_prefill_decode_attention",
    "use_cudnn_prefill",
    "use_trtllm_ragged_deepseek_prefill",
    "use_trtllm_attention",
    "disable_flashinfer_prefill",
    "disable_flashinfer_q_quantization",
)


def _reset(changes: list, root: Any, path: str, value: Any, reason: str) -> None:
    obj = root
    for part in path.split(".")[:-1]:
        obj = getattr(obj, part, None)
        if obj is None:
            return
    if not hasattr(obj, path.split(".")[-1]):
        return
    changes.append(change(root, path, value, reason))


def npu_fixups(vllm_config: Any) -> list[ConfigChange]:
    changes: list[ConfigChange | None] = []
    _reset(changes, vllm_config, "model_config.disable_cascade_attn", False, "cascade attention is GPU-only")
    _reset(changes, vllm_config, "cache_config.cpu_kvcache_space_bytes", None, "a CPU-backend option")
    _reset(changes, vllm_config, "observability_config.enable_layerwise_nvtx_tracing", False, "NVTX is NVIDIA-only")
    _reset(changes, vllm_config, "scheduler_config.max_num_partial_prefills", 1, "partial prefills are ROCm-tuned")
    if vllm_config.speculative_config is not None:
        _reset(changes, vllm_config, "speculative_config.quantization", None,
               "the drafter inherits the target model's quantization on Ascend")
    for flag in _ATTENTION_FLAGS_OFF:
        _reset(changes, vllm_config, f"attention_config.{flag}", False, "GPU-only attention option")
    _reset(changes, vllm_config, "attention_config.flash_attn_version", None, "FlashAttention is GPU-only")
    _reset(changes, vllm_config, "attention_config.backend", None, "Ascend backends come from the attention plugins")
    return [c for c in changes if c is not None]


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any):
    if device.kind != "npu":
        return None
    return npu_fixups(vllm_config)

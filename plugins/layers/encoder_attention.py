"""The vision encoder's attention: the decision record, and ``--mm-encoder-attn-backend``.

vLLM's ``MMEncoderAttention`` picks a ViT backend per platform (``TORCH_SDPA`` on a CPU; FlashAttention
and others on GPUs); the ``ascend`` layer-ops choice replaces the layer itself, so that backend names
nothing that runs. The choice follows ``layer_ops`` and is recorded as its own decision
(``mm_encoder_attention``) for multimodal models, so ``explain`` and the report say which attention the
encoder runs; a user's ``--mm-encoder-attn-backend`` is reset (as Ascend's platform does) when the
replacement will run, and the reset is a recorded config change.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.config_changes import ConfigChange, change
from ascend_kernel.registry import Candidate, DecisionRecord

FAMILY = "mm_encoder_attention"
BACKEND_PATH = "model_config.multimodal_config.mm_encoder_attn_backend"
WHAT = {
    "ascend": "the seam's mm_encoder_attention: npu_fused_infer_attention_score in TND (head dims in (64, 128) "
              "padded to 128) on an NPU, SDPA per packed image/window in the reference provider",
    "vllm-native": "vLLM's MMEncoderAttention with the platform's ViT backend (TORCH_SDPA on a CPU)",
}


def replaced(settings: Any, device_kind: str) -> bool:
    """Whether the ``ascend`` layer ops will replace the encoder's attention (before the family is chosen)."""
    return device_kind == "npu" or settings.forced("layer_ops") == "ascend"


def reset_backend(settings: Any, vllm_config: Any, device_kind: str) -> list[ConfigChange]:
    """Reset ``--mm-encoder-attn-backend`` when the kernel's own encoder attention replaces vLLM's layer."""
    model_config = getattr(vllm_config, "model_config", None)  # None: the hook asked without an engine config
    multimodal = getattr(model_config, "multimodal_config", None)
    if multimodal is None or multimodal.mm_encoder_attn_backend is None or not replaced(settings, device_kind):
        return []
    made = change(vllm_config, BACKEND_PATH, None, "the ascend layer ops replace MMEncoderAttention "
                  "(decision mm_encoder_attention); vLLM's ViT backend would name nothing that runs")
    return [made] if made is not None else []


def record(kernel: Any, layer_ops: str) -> None:
    """Add the ``mm_encoder_attention`` decision once per process, for a multimodal model only."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    model = getattr(config, "model_config", None)
    if model is None or not model.is_multimodal_model or any(r.family == FAMILY for r in kernel.records):
        return
    owner = next((r for r in kernel.records if r.family == "layer_ops"), None)
    plugin, entry_point = (owner.plugin, owner.entry_point) if owner else ("layers", "")
    chosen = "ascend" if layer_ops == "ascend" else "vllm-native"
    candidates = tuple(
        Candidate(name, plugin or "", entry_point or "", 0, name == chosen,
                  f"chosen: {WHAT[name]}" if name == chosen else f"not the layer_ops choice ({WHAT[name]})")
        for name in WHAT)
    kernel.records.append(DecisionRecord(FAMILY, "", chosen, plugin, entry_point,
                                         f"follows layer_ops={layer_ops} (ASCEND_KERNEL_LAYER_OPS)", candidates))

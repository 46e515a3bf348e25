"""The DeepSeek family: V2 (MLA + MoE), V3.2-style sparse attention, and V3 with an MTP layer.

vLLM's CPU MLA path needs DeepSeek's real latent sizes (``kv_lora_rank=512``,
``qk_rope_head_dim=64``), so those are kept while everything else is tiny.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.models.builders import DECODER, ROPE, Recipe, config_of, seeded_normal

#: Multi-head latent attention at DeepSeek's real latent sizes, and a small MoE (one dense layer first).
MLA_MOE: dict[str, Any] = {
    **DECODER,
    **ROPE,
    "num_key_value_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
}


def v2_config(vocab_size: int) -> Any:
    """DeepSeek-V2 with MLA and MoE (softmax routing, greedy top-k)."""
    from transformers import DeepseekV2Config

    return config_of(DeepseekV2Config, vocab_size, MLA_MOE, moe_layer_freq=1, topk_method="greedy",
                     norm_topk_prob=False)


def v32_config(vocab_size: int) -> Any:
    """DeepSeek-V3.2-style sparse attention: the DeepSeek-V2 model plus a lightning indexer per layer.

    transformers has no V3.2 model, but vLLM builds one from a DeepSeek-V2
    config that carries ``index_topk``/``index_n_heads``/``index_head_dim``
    (and a low-rank query, which the indexer reads). transformers' DeepSeek-V2
    loads the same checkpoint and ignores the indexer weights: that is dense
    attention, which the sparse model equals whenever ``index_topk`` covers
    every position. ``index_topk`` is small (32) so that longer prompts really
    drop positions; 16 indexer heads make exact score ties (every head's relu
    at zero) rare.
    """
    config = v2_config(vocab_size)
    config.q_lora_rank = 64
    config.index_topk = 32
    config.index_n_heads = 16
    config.index_head_dim = 128
    return config


def v32_indexer_weights(config: Any, seed: int) -> dict[str, Any]:
    """The indexer of every layer, named as DeepSeek-V3.2 checkpoints name it (drawn from a seed of its own)."""
    import torch

    draw = seeded_normal(seed + 32)
    heads, dim = config.index_n_heads, config.index_head_dim
    weights = {}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.self_attn.indexer"
        weights[f"{prefix}.wq_b.weight"] = draw(heads * dim, config.q_lora_rank)
        weights[f"{prefix}.wk.weight"] = draw(dim, config.hidden_size)
        weights[f"{prefix}.weights_proj.weight"] = draw(heads, config.hidden_size)
        weights[f"{prefix}.k_norm.weight"] = torch.ones(dim)
        weights[f"{prefix}.k_norm.bias"] = draw(dim)
    return weights


def mtp_config(vocab_size: int) -> Any:
    """DeepSeek-V3 (MLA, sigmoid-scored MoE with a correction bias) with one next-token-prediction layer.

    The MTP layer is stored as layer ``num_hidden_layers`` (see
    :func:`mtp_layer_weights`); transformers' DeepSeek-V3 ignores it, vLLM's
    MTP drafter loads it. ``topk_method``/``scoring_func`` are written for vLLM
    (transformers' V3 always scores with sigmoid and the bias).
    """
    from transformers import DeepseekV3Config

    return config_of(DeepseekV3Config, vocab_size, MLA_MOE, norm_topk_prob=True, num_nextn_predict_layers=1,
                     topk_method="noaux_tc", scoring_func="sigmoid")


def mtp_layer_weights(config: Any, seed: int) -> dict[str, Any]:
    """The MTP layer as DeepSeek-V3 checkpoints store it: a decoder layer plus its projection and head.

    Its experts are saved one tensor per expert (``experts.{e}.gate_proj``...),
    the layout vLLM's MTP loader reads (it does not read transformers' fused
    ``experts.gate_up_proj``). Drawn from a seed of its own.
    """
    import torch

    draw = seeded_normal(seed + 77)
    hidden, heads, lora = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
    nope, rope, v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    inter, shared = config.moe_intermediate_size, config.moe_intermediate_size * config.n_shared_experts
    shapes = {
        "self_attn.q_proj.weight": (heads * (nope + rope), hidden),
        "self_attn.kv_a_proj_with_mqa.weight": (lora + rope, hidden),
        "self_attn.kv_b_proj.weight": (heads * (nope + v_dim), lora),
        "self_attn.o_proj.weight": (hidden, heads * v_dim),
        "mlp.gate.weight": (config.n_routed_experts, hidden),
        "mlp.gate.e_score_correction_bias": (config.n_routed_experts,),
        "mlp.shared_experts.gate_proj.weight": (shared, hidden),
        "mlp.shared_experts.up_proj.weight": (shared, hidden),
        "mlp.shared_experts.down_proj.weight": (hidden, shared),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.head.weight": (config.vocab_size, hidden),
    }
    for e in range(config.n_routed_experts):
        shapes[f"mlp.experts.{e}.gate_proj.weight"] = (inter, hidden)
        shapes[f"mlp.experts.{e}.up_proj.weight"] = (inter, hidden)
        shapes[f"mlp.experts.{e}.down_proj.weight"] = (hidden, inter)
    prefix = f"model.layers.{config.num_hidden_layers}"
    weights = {f"{prefix}.{name}": draw(*shape) for name, shape in shapes.items()}
    for norm, size in (("self_attn.kv_a_layernorm", lora), ("input_layernorm", hidden),
                       ("post_attention_layernorm", hidden), ("enorm", hidden), ("hnorm", hidden),
                       ("shared_head.norm", hidden)):
        weights[f"{prefix}.{norm}.weight"] = torch.ones(size)
    return weights


RECIPES: dict[str, Recipe] = {
    "deepseek_v2": Recipe(v2_config),
    "deepseek_v32": Recipe(v32_config, extra_weights=v32_indexer_weights),
    "deepseek_mtp": Recipe(mtp_config, extra_weights=mtp_layer_weights),
}

"""The Llama family: the tiny Llama, and EAGLE-1 and EAGLE-3 draft heads for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ascend_kernel.models.builders import DECODER, ROPE, Recipe, config_of, replace_checkpoint, seeded_normal

#: the tiny Llama's layers whose hidden states an EAGLE-3 head reads (vLLM's default assumes deeper models)
EAGLE3_AUX_LAYERS = [0, 1]


def llama_config(vocab_size: int) -> Any:
    """Llama with GQA; head_dim 64 because vLLM's CPU attention rejects smaller heads."""
    from transformers import LlamaConfig

    return config_of(LlamaConfig, vocab_size, {**DECODER, **ROPE}, head_dim=64)


def eagle_config(vocab_size: int) -> Any:
    """An EAGLE draft head for the tiny Llama: one Llama decoder layer over [embedding; target hidden]."""
    config = llama_config(vocab_size)
    config.num_hidden_layers = 1
    return config


def as_eagle_head(path: Path, config: Any, seed: int, dtype: Any) -> None:
    """Rewrite a saved one-layer Llama into an EAGLE-1 head checkpoint, as vLLM's EagleLlama loads it.

    The head keeps the decoder layer (without its input norm: EAGLE feeds the
    layer the fused input directly) and the embedding, adds ``fc`` ([hidden,
    2 * hidden], over the concatenated token embedding and target hidden
    state), and drops the final norm and LM head (the target's are used).
    Names carry no ``model.`` prefix, as published EAGLE heads do.
    """
    from safetensors.torch import load_file

    state = load_file(path)
    head = {}
    for name, tensor in state.items():
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            head[name.removeprefix("model.")] = tensor
        elif name == "model.embed_tokens.weight":
            head["embed_tokens.weight"] = tensor
    draw = seeded_normal(seed + 91)
    head["fc.weight"] = draw(config.hidden_size, 2 * config.hidden_size).to(dtype)
    replace_checkpoint(path, head)


def eagle3_config(vocab_size: int) -> Any:
    """An EAGLE-3 draft head for the tiny Llama: it reads the target's hidden states of several layers."""
    config = eagle_config(vocab_size)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS}
    return config


def as_eagle3_head(path: Path, config: Any, seed: int, dtype: Any) -> None:
    """Rewrite a saved one-layer Llama into an EAGLE-3 head checkpoint, as vLLM's Eagle3Llama loads it.

    EAGLE-3 fuses the target's hidden states of :data:`EAGLE3_AUX_LAYERS`
    (``fc``: [hidden, layers * hidden]); its single decoder layer attends over
    [token embedding; fused hidden] (q/k/v take 2 * hidden inputs) with a
    ``hidden_norm`` beside the input norm; it has its own final ``norm`` and
    ``lm_head`` and borrows the target's embedding.
    """
    import torch
    from safetensors.torch import load_file

    state = load_file(path)
    draw = seeded_normal(seed + 93)
    hidden = config.hidden_size
    head = {name.removeprefix("model."): tensor for name, tensor in state.items()
            if name.startswith("model.layers.0.") or name in ("model.norm.weight", "lm_head.weight")}
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"layers.0.self_attn.{proj}.weight"
        head[name] = draw(head[name].shape[0], 2 * hidden).to(dtype)
    head["layers.0.hidden_norm.weight"] = torch.ones(hidden, dtype=dtype)
    head["fc.weight"] = draw(hidden, len(EAGLE3_AUX_LAYERS) * hidden).to(dtype)
    replace_checkpoint(path, head)


RECIPES: dict[str, Recipe] = {
    "llama": Recipe(llama_config),
    "llama_eagle": Recipe(eagle_config, rewrite=as_eagle_head),
    "llama_eagle3": Recipe(eagle3_config, rewrite=as_eagle3_head),
}

"""The Gemma family: Gemma3n's text model, whose last layers reuse an earlier layer's KV cache."""

from __future__ import annotations

from typing import Any

from ascend_kernel.models.builders import DECODER, Recipe, config_of
from ascend_kernel.models.tokenizer import MAX_POSITIONS


def gemma3n_config(vocab_size: int) -> Any:
    """Gemma3n text model whose last two layers reuse layer 1's KV cache (cross-layer KV sharing)."""
    from transformers import Gemma3nTextConfig

    layers = 4
    return config_of(Gemma3nTextConfig, vocab_size, DECODER, vocab_size_per_layer_input=vocab_size,
                     hidden_size_per_layer_input=16, num_hidden_layers=layers, head_dim=64,
                     layer_types=["full_attention"] * layers, sliding_window=MAX_POSITIONS, num_kv_shared_layers=2,
                     laurel_rank=8, altup_num_inputs=2, activation_sparsity_pattern=[0.0] * layers,
                     tie_word_embeddings=True)


RECIPES: dict[str, Recipe] = {"gemma3n": Recipe(gemma3n_config)}

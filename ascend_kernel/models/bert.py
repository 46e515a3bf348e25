"""The BERT family: an encoder for embeddings (encoder-only attention, no KV cache at all)."""

from __future__ import annotations

from typing import Any

from ascend_kernel.models.builders import COMMON, Recipe, config_of
from ascend_kernel.models.tokenizer import MAX_POSITIONS


def bert_config(vocab_size: int) -> Any:
    """BERT encoder, saved without an LM head: vLLM serves it as an embedding model."""
    from transformers import BertConfig

    return config_of(BertConfig, vocab_size, COMMON, num_attention_heads=2, intermediate_size=256,
                     max_position_embeddings=MAX_POSITIONS)


RECIPES: dict[str, Recipe] = {"bert": Recipe(bert_config, encoder=True)}

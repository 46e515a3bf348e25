"""What every tiny-model family shares: the common dimensions, the recipe shape and the weight helpers.

The dimensions are small but not arbitrary: vLLM's CPU attention only accepts
some head sizes (64 works, 16 does not), so attention models use head_dim 64.
Weights are drawn wider than a real model's init (std :data:`INIT_STD`) so that
greedy decoding gives varied tokens with clear margins instead of one token
repeated, or near-ties that float rounding could flip.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ascend_kernel.models.tokenizer import MAX_POSITIONS

#: Std of the normal every weight matrix is drawn from (norm weights are ones).
INIT_STD = 0.2

#: Every family: two layers of width 128.
COMMON: dict[str, Any] = {"hidden_size": 128, "num_hidden_layers": 2, "initializer_range": INIT_STD}

#: Decoder-only attention models: two query heads over one KV head (GQA), an MLP of 256.
DECODER: dict[str, Any] = {
    **COMMON,
    "max_position_embeddings": MAX_POSITIONS,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}

#: Rotary embeddings, for the families whose configs take ``rope_parameters``.
ROPE: dict[str, Any] = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def config_of(config_cls: Any, vocab_size: int, base: dict[str, Any], **fields: Any) -> Any:
    """``config_cls`` built from a shared ``base`` with this family's ``fields`` on top."""
    return config_cls(vocab_size=vocab_size, **{**base, **fields})


@dataclass(frozen=True)
class Vision:
    """What a vision-language recipe adds to the text build: its tokens and template, its processor files."""

    prepare_tokenizer: Callable[[Any], None]
    save_processor: Callable[[Path, Any], None]


@dataclass(frozen=True)
class Recipe:
    """How one architecture is written: its config, and what its checkpoint needs beyond transformers' model.

    ``extra_weights(config, seed)`` returns tensors transformers' class lacks
    but vLLM loads (an MTP layer, a sparse-attention indexer), appended to the
    checkpoint; ``rewrite(path, config, seed, dtype)`` turns the saved
    checkpoint into another layout (a draft head). ``encoder`` models are saved
    as bare encoders, without an LM head; ``vision`` models are image-text models.
    """

    config: Callable[[int], Any]
    extra_weights: Callable[[Any, int], dict[str, Any]] | None = None
    rewrite: Callable[[Path, Any, int, Any], None] | None = None
    encoder: bool = False
    vision: Vision | None = None


def seeded_normal(seed: int) -> Callable[..., Any]:
    """A draw of ``N(0, INIT_STD)`` tensors from a generator of its own, so extra weights never shift the others."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen) * INIT_STD

    return draw


def init_weights(model: Any, seed: int) -> None:
    """Draw every parameter from one seeded generator, in sorted-name order.

    Transformers' own init is replaced so that the scale and the bytes depend
    only on the seed: norm weights are ones, everything else (projections,
    embeddings, router gates, biases) is ``N(0, INIT_STD)``.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim == 1 and "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD)


def add_weights(path: Path, tensors: dict[str, Any], dtype: Any) -> None:
    """Append ``tensors`` (cast to ``dtype``) to a single-file safetensors checkpoint; never overwrite one."""
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    clash = sorted(set(state) & set(tensors))
    if clash:
        raise ValueError(f"extra weights would overwrite {clash[:3]} in {path}")
    state.update({name: t.to(dtype).contiguous() for name, t in tensors.items()})
    save_file(state, path, metadata={"format": "pt"})


def replace_checkpoint(path: Path, tensors: dict[str, Any]) -> None:
    """Write ``tensors`` as the whole single-file checkpoint at ``path`` (a draft head's own layout)."""
    from safetensors.torch import save_file

    path.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})

"""The state-space family: Mamba2 (attention-free) and Falcon-H1 (attention and Mamba2 side by side)."""

from __future__ import annotations

from typing import Any

from ascend_kernel.models.builders import COMMON, DECODER, Recipe, config_of


def mamba2_config(vocab_size: int) -> Any:
    """Mamba2: attention-free, its KV cache is the conv and SSM state per layer."""
    from transformers import Mamba2Config

    return config_of(Mamba2Config, vocab_size, COMMON, num_heads=4, head_dim=64, state_size=16, n_groups=1,
                     expand=2, conv_kernel=4, chunk_size=64, layer_norm_epsilon=1e-6, tie_word_embeddings=False)


def falcon_h1_config(vocab_size: int) -> Any:
    """Falcon-H1: every layer runs attention and a Mamba2 mixer side by side (a hybrid KV cache)."""
    from transformers import FalconH1Config

    return config_of(FalconH1Config, vocab_size, DECODER, head_dim=64, mamba_d_ssm=128, mamba_n_heads=2,
                     mamba_d_head=64, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                     mamba_chunk_size=64, mamba_rms_norm=False)


RECIPES: dict[str, Recipe] = {
    "mamba2": Recipe(mamba2_config),
    "falcon_h1": Recipe(falcon_h1_config),
}

"""What every KV layout shares: PD alignment and the page arithmetic checks."""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.errors import KVCacheAllocationError


def pd_alignment(vllm_config: Any, settings: Any) -> int:
    """Prefill/decode disaggregation (llmdatadist) needs every KV tensor 2 MiB-aligned."""
    return settings.kv_transfer_alignment_bytes if vllm_config.kv_transfer_config is not None else 1


def check_placement(placement: Any, spec: Any, num_blocks: int) -> None:
    """The placement must hold ``num_blocks`` pages of every layer it names."""
    page = spec.page_size_bytes
    last_layer = len(placement.layers) - 1
    end = placement.offset + last_layer * placement.layer_stride + (num_blocks - 1) * placement.block_stride + page
    if num_blocks < 1 or end > placement.size:
        raise KVCacheAllocationError(
            f"KV cache tensor for layers {placement.layers[:3]}{'...' if len(placement.layers) > 3 else ''} "
            f"needs {end} bytes for {num_blocks} blocks of {page} bytes, but the config gives {placement.size}"
        )


def split_kv(view: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a full-attention page view ``[blocks, heads, tokens, head_size + head_size_v]``."""
    return view[..., :head_size], view[..., head_size:]

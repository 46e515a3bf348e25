"""The standard KV layout: K and V of full-attention layers, split per layer.

vLLM 0.32 places every layer's pages in one backing allocation described by
``KVCacheTensor`` (offset, layer stride, block stride). This layout turns a
placement into one view per layer, ``[blocks, kv_heads, block_tokens,
head_size + head_size_v]`` in the cache dtype, whose last dimension holds K
then V: :func:`k_and_v` gives the Ascend kernels their separate K and V
caches as views, with no copy. The page arithmetic is checked against the
placement before anything is viewed, so a short config is an error naming the
layers and the bytes, not a silent overrun.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import page_views, pd_alignment, split_kv

ASCEND_KERNEL_ESSENTIAL = "full-attention layers (every decoder model) need the standard KV layout"


class StandardKVLayout:
    """Full-attention K/V pages; the layout every decoder model needs."""

    __slots__ = ("alignment_bytes", "resolved_layout", "device")

    def __init__(self, alignment_bytes: int, resolved_layout: Any, device: Any) -> None:
        self.alignment_bytes = alignment_bytes
        self.resolved_layout = resolved_layout
        self.device = device

    @classmethod
    def from_context(cls, ctx: Any) -> "StandardKVLayout":
        from ascend_kernel.device import Device

        return cls(
            pd_alignment(ctx.vllm_config, ctx.settings),
            ctx.vllm_config.cache_config.get_resolved_kv_cache_layout(),
            Device(ctx.device.kind),
        )

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        views = page_views(backing, placement, spec, num_blocks, kernel_block_size, self.resolved_layout)
        # ACL format ND (2) on NPU: the paged-attention kernels read ND caches.
        return [self.device.format_cast(v, 2) for v in views]

    @staticmethod
    def k_and_v(view: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_kv(view, head_size)


def _supports(ctx: Any) -> str | None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    spec_type = ctx.subject
    if spec_type is None or not issubclass(spec_type, FullAttentionSpec):
        return f"handles FullAttentionSpec only (got {getattr(spec_type, '__name__', spec_type)})"
    if issubclass(spec_type, MLAAttentionSpec):
        return "MLA caches have no separate K and V"
    return None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="standard",
            factory=StandardKVLayout.from_context,
            supports=_supports,
            priority=10,
            description="full-attention K/V pages, split per layer; 2 MiB-aligned with PD transfer",
        )
    ]

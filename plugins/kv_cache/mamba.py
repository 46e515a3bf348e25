"""The Mamba layout: all recurrent states of a layer in one page per block.

A Mamba layer's "KV cache" is its conv state and SSM state (shapes and dtypes
from ``MambaSpec``). They are packed one after the other into the layer's
page, so one block id addresses every state of a sequence. :func:`state_views`
gives each state as a strided view ``[blocks, *shape]`` over the pages (the
page stride, not the state size, separates consecutive blocks).
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import page_views, pd_alignment


def state_views(page_view: torch.Tensor, spec: Any) -> list[torch.Tensor]:
    """Per-state views ``[blocks, *shape]`` of a layer's ``[blocks, 1, 1, page_bytes]`` int8 page view."""
    pages = page_view.reshape(page_view.shape[0], -1) if page_view.is_contiguous() else \
        page_view.squeeze(1).squeeze(1)
    out = []
    offset = 0
    for shape, dtype in zip(spec.shapes, spec.dtypes):
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = prod(shape) * itemsize
        out.append(pages[:, offset:offset + nbytes].view(dtype).view(-1, *shape))
        offset += nbytes
    return out


class MambaLayout:
    __slots__ = ("alignment_bytes", "resolved_layout")

    def __init__(self, alignment_bytes: int, resolved_layout: Any) -> None:
        self.alignment_bytes = alignment_bytes
        self.resolved_layout = resolved_layout

    @classmethod
    def from_context(cls, ctx: Any) -> "MambaLayout":
        return cls(pd_alignment(ctx.vllm_config, ctx.settings),
                   ctx.vllm_config.cache_config.get_resolved_kv_cache_layout())

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        state_bytes = sum(prod(s) * torch.empty((), dtype=d).element_size() for s, d in zip(spec.shapes, spec.dtypes))
        if state_bytes > spec.page_size_bytes:
            raise KVCacheAllocationError(
                f"Mamba layers {placement.layers[:3]}: states need {state_bytes} bytes per block, "
                f"the page has {spec.page_size_bytes}"
            )
        return page_views(backing, placement, spec, num_blocks, kernel_block_size, self.resolved_layout)

    @staticmethod
    def state_views(page_view: torch.Tensor, spec: Any) -> list[torch.Tensor]:
        return state_views(page_view, spec)


def _supports(ctx: Any) -> str | None:
    from vllm.v1.kv_cache_interface import MambaSpec

    if ctx.subject is None or not issubclass(ctx.subject, MambaSpec):
        return f"handles MambaSpec only (got {getattr(ctx.subject, '__name__', ctx.subject)})"
    return None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="mamba",
            factory=MambaLayout.from_context,
            supports=_supports,
            priority=20,
            description="Mamba conv/SSM states packed per block; strided per-state views",
        )
    ]

"""Fallback KV layout: vLLM's own page views for spec kinds no dedicated layout claims.

It keeps every model vLLM-CPU runs (sliding-window, encoder-decoder, ...)
working on the kernel platform; its decision record makes it visible whenever
it is the one in use.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import PageViewLayout, layout_entry


class VllmViewsLayout(PageViewLayout):
    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        if not spec.has_layer_views:  # vLLM hands such layers the raw buffer
            return [backing] * len(placement.layers)
        return super().views(backing, placement, spec, num_blocks, kernel_block_size)


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("vllm-views", VllmViewsLayout, -100,
                        "vLLM's own page views, for spec kinds without a dedicated layout")

"""The standard KV layout: K and V of full-attention layers, split per layer.

vLLM 0.32 places every layer's pages in one backing allocation described by
``KVCacheTensor`` (offset, layer stride, block stride). This layout turns a
placement into one view per layer, ``[blocks, kv_heads, block_tokens,
head_size + head_size_v]`` in the cache dtype, whose last dimension holds K
then V: :meth:`StandardKVLayout.k_and_v` gives the Ascend kernels their
separate K and V caches as views, with no copy. The page arithmetic is
checked against the placement before anything is viewed, so a short config is
an error naming the layers and the bytes, not a silent overrun.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.device import Device
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import PageViewLayout, handles_kv_attention, layout_entry, split_kv
from ascend_kernel_plugins.kv_cache.int8_bsh import INT8_KV_CACHE_DTYPE, uses_int8_bsh
from ascend_kernel_plugins.kv_cache.settings import KVCacheSettings

ASCEND_KERNEL_ESSENTIAL = "full-attention layers (every decoder model) need the standard KV layout"


@hookimpl
def ascend_kernel_settings() -> type[KVCacheSettings]:
    return KVCacheSettings

#: ACL storage formats: ND for the paged-attention kernels, FRACTAL_NZ on 310P
ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29


class StandardKVLayout(PageViewLayout):
    """Full-attention K/V pages; the layout every decoder model needs."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.device = Device(ctx.device.kind)
        self.acl_format = ACL_FORMAT_FRACTAL_NZ if ctx.device.soc == "310P" else ACL_FORMAT_ND

    def post(self, view: torch.Tensor) -> torch.Tensor:
        return self.device.format_cast(view, self.acl_format)

    @staticmethod
    def k_and_v(view: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_kv(view, head_size)


def _int8_pages(ctx: Any) -> str | None:
    if uses_int8_bsh(ctx.vllm_config):
        return f"{INT8_KV_CACHE_DTYPE} caches are int8 BSH pages (layout int8-bsh)"
    return None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("standard", StandardKVLayout, 10,
                        "full-attention K/V pages, split per layer; 2 MiB-aligned with PD transfer",
                        handles_kv_attention, _int8_pages)

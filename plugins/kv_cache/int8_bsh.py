"""The int8 "BSH" KV layout: per-token-head int8 K/V pages with their float32 scales.

With ``kv_cache_dtype="int8_per_token_head"`` (vLLM's own name for dynamic
int8 KV quantisation) every cached token keeps, per KV head, its K and V
rounded to int8 plus one float32 scale each. The Ascend kernels read int8
caches in the "BSH" shape ``[blocks, block_tokens, kv_heads * head_size]``,
so a page of ``N`` tokens is laid out block-major, each part contiguous:

====================  ============================  =========
part                  shape within the page          dtype
====================  ============================  =========
key                   ``[N, H * head_size]``         int8
value                 ``[N, H * head_size_v]``       int8
key scales            ``[N, H]``                     float32
value scales          ``[N, H]``                     float32
====================  ============================  =========

vLLM 0.32 sees one head slot of ``page_bytes / N`` bytes per token (the spec
the Ascend backend publishes through ``customize_spec``), so the scheduler,
prefix caching, block copies and KV connectors keep addressing whole pages
by block id; only this layout and the backend know what is inside a page.
The byte format lives here, in one place, and the backend reads it through
:func:`bsh_parts`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import PageViewLayout, handles_kv_attention, layout_entry

INT8_KV_CACHE_DTYPE = "int8_per_token_head"
_SCALE_BYTES = 4  # float32


def token_bytes(num_kv_heads: int, head_size: int, head_size_v: int) -> int:
    """Bytes one token takes in a page: int8 K and V of every head, and two float32 scales per head."""
    return num_kv_heads * (head_size + head_size_v) + 2 * _SCALE_BYTES * num_kv_heads


def bsh_spec(spec: Any) -> Any:
    """The page spec the Ascend backend publishes for an int8 per-token-head attention spec."""
    return replace(spec, num_head_slots=1,
                   state_content_bytes=token_bytes(spec.num_kv_heads, spec.head_size, spec.head_size_v))


def uses_int8_bsh(vllm_config: Any) -> bool:
    cache = getattr(vllm_config, "cache_config", None)
    return cache is not None and cache.cache_dtype == INT8_KV_CACHE_DTYPE


class Int8BSHCaches(NamedTuple):
    """Views of one layer's pages; K/V as ``[blocks, N, H, D]`` (``.flatten(2)`` gives BSH)."""

    key: torch.Tensor
    value: torch.Tensor
    key_scale: torch.Tensor  # [blocks, N, H] float32
    value_scale: torch.Tensor


def bsh_parts(page_view: torch.Tensor, num_kv_heads: int, head_size: int, head_size_v: int) -> Int8BSHCaches:
    """Split vLLM's ``[blocks, 1, N, token_bytes]`` int8 page view into the four parts (no copy)."""
    blocks, slots, n, content = page_view.shape
    expected = token_bytes(num_kv_heads, head_size, head_size_v)
    if slots != 1 or content != expected or page_view.dtype != torch.int8:
        raise KVCacheAllocationError(
            f"int8 BSH page view {tuple(page_view.shape)} ({page_view.dtype}) is not "
            f"[blocks, 1, tokens, {expected}] int8 for {num_kv_heads} heads of {head_size}/{head_size_v}"
        )
    if page_view.stride(2) != content or page_view.stride(3) != 1:
        raise KVCacheAllocationError(
            f"int8 BSH pages must be dense (strides {page_view.stride()}); use a layout that keeps a page contiguous"
        )
    block_stride, base = page_view.stride(0), page_view.storage_offset()
    h = num_kv_heads
    k_bytes, v_bytes, s_bytes = n * h * head_size, n * h * head_size_v, n * h * _SCALE_BYTES
    key = page_view.as_strided((blocks, n, h, head_size), (block_stride, h * head_size, head_size, 1), base)
    value = page_view.as_strided((blocks, n, h, head_size_v), (block_stride, h * head_size_v, head_size_v, 1),
                                 base + k_bytes)

    def scales(offset: int) -> torch.Tensor:
        raw = page_view.as_strided((blocks, s_bytes), (block_stride, 1), base + offset)
        return raw.view(torch.float32).view(blocks, n, h)

    return Int8BSHCaches(key, value, scales(k_bytes + v_bytes), scales(k_bytes + v_bytes + s_bytes))


class Int8BSHLayout(PageViewLayout):
    """Page views of int8 per-token-head full-attention caches; the backend splits them with :func:`bsh_parts`."""

    def check(self, placement: Any, spec: Any) -> None:
        expected = token_bytes(spec.num_kv_heads, spec.head_size, spec.head_size_v)
        if spec.num_heads != 1 or spec.state_content_size_bytes != expected:
            raise KVCacheAllocationError(
                f"int8 BSH layers {placement.layers[:3]}: the spec has {spec.num_heads} head slots of "
                f"{spec.state_content_size_bytes} bytes per token, the layout needs 1 slot of {expected} "
                "(the attention backend must publish the BSH spec; the Ascend backend does)"
            )
        if spec.page_size_bytes % _SCALE_BYTES or placement.block_stride % _SCALE_BYTES \
                or placement.offset % _SCALE_BYTES:
            raise KVCacheAllocationError(
                f"int8 BSH layers {placement.layers[:3]}: page {spec.page_size_bytes} B, block stride "
                f"{placement.block_stride} B and offset {placement.offset} B must be multiples of 4 for the scales"
            )


def _not_int8(ctx: Any) -> str | None:
    if uses_int8_bsh(ctx.vllm_config):
        return None
    cache = getattr(ctx.vllm_config, "cache_config", None)
    return f"kv_cache_dtype is {getattr(cache, 'cache_dtype', None)!r}, not {INT8_KV_CACHE_DTYPE!r}"


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("int8-bsh", Int8BSHLayout, 20, "int8 per-token-head K/V in BSH pages with float32 scales "
                        "(kv_cache_dtype=int8_per_token_head)", handles_kv_attention, _not_int8)

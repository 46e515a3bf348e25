"""The Ascend backend's KV-sharing path: a layer without K/V of its own reads the step's K/V back.

vLLM passes ``key=value=None`` to a layer that shares another layer's KV
cache. In a prefill the sharing layer must attend over exactly what its
target cached this step, so its output must equal the target's own output for
the same query.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernel_plugins.attention.ascend.backend import AscendAttentionImpl, AscendMetadata
from ascend_kernel_plugins.attention.masks import AttentionMaskBuilder
from ascend_kernel_plugins.attention.states import AttentionState
from ascend_kernel_plugins.kv_cache.int8_bsh import token_bytes

HEADS, KV_HEADS, D, BLOCK = 4, 2, 64, 16


@pytest.fixture(autouse=True)
def active_kernel():
    from ascend_kernel import kernel as kernel_mod

    saved = kernel_mod._current
    kernel_mod._current = kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu")
    yield
    kernel_mod._current = saved


def impl(kv_cache_dtype: str, sharing: str | None) -> AscendAttentionImpl:
    return AscendAttentionImpl(HEADS, D, D ** -0.5, KV_HEADS, None, None, kv_cache_dtype,
                               kv_sharing_target_layer_name=sharing)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
def test_sharing_layer_prefill_attends_over_its_targets_cached_kv(kv_cache_dtype):
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([7, 19], dtype=torch.int32)
    n = int(lens.sum())
    blocks = 6
    if kv_cache_dtype == "auto":
        cache = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * D)
    else:
        cache = torch.zeros(blocks, 1, BLOCK, token_bytes(KV_HEADS, D, D), dtype=torch.int8)
    table = torch.tensor([[4, 0], [1, 5]], dtype=torch.int32)  # scattered blocks
    slots = torch.cat([table[r, torch.arange(int(l)) // BLOCK] * BLOCK + torch.arange(int(l)) % BLOCK
                       for r, l in enumerate(lens)])
    mask = AttentionMaskBuilder().causal(int(lens.max()), torch.float32, torch.device("cpu"))
    meta = AscendMetadata(n, AttentionState.PrefillNoCache, lens, lens, table, slots, mask)
    q = torch.randn(n, HEADS * D, generator=gen)
    k, v = torch.randn(n, KV_HEADS * D, generator=gen), torch.randn(n, KV_HEADS * D, generator=gen)

    owner_out = impl(kv_cache_dtype, None).forward(None, q, k, v, cache, meta, torch.empty(n, HEADS * D))
    sharer_out = impl(kv_cache_dtype, "model.layers.0.self_attn.attn").forward(
        None, q, None, None, cache, meta, torch.empty(n, HEADS * D))
    if kv_cache_dtype == "auto":
        torch.testing.assert_close(sharer_out, owner_out, rtol=1e-5, atol=1e-5)
    else:  # the owner attends over fresh K/V, the sharer over their int8 round trip
        torch.testing.assert_close(sharer_out, owner_out, rtol=0, atol=0.05)
    # and it is the step's K/V it read: the same layer over an empty cache gives something else
    empty = torch.zeros_like(cache)
    stale = impl(kv_cache_dtype, "model.layers.0.self_attn.attn").forward(
        None, q, None, None, empty, meta, torch.empty(n, HEADS * D))
    assert not torch.allclose(stale, owner_out, atol=0.05)

"""int8 per-token-head KV: the quantiser on the seam, and paged attention over int8 BSH pages.

The quantiser is checked against its definition in float64 (vLLM's
``int8_per_token_head``: scale = max|x| / 127, round half away from zero).
The int8 path of the Ascend backend (write, then dequantise the referenced
blocks and run the paged kernel) is checked against naive float64 attention
over the dequantised keys and values, so a wrong scale, slot or block
renumbering fails.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops
from ascend_kernel_plugins.attention.ascend.backend import _dequantized_blocks
from ascend_kernel_plugins.kv_cache.int8_bsh import bsh_parts, token_bytes
from tests.ops.test_reference_ops import naive

ops = get_ops("reference", "cpu")


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 9), heads=st.integers(1, 4), dim=st.sampled_from([8, 64]),
       magnitude=st.sampled_from([1e-3, 1.0, 300.0]), seed=st.integers(0, 999))
def test_quantiser_matches_its_definition(tokens, heads, dim, magnitude, seed):
    x = torch.randn(tokens, heads, dim, generator=torch.Generator().manual_seed(seed)) * magnitude
    x[0, 0] = 0.0  # an all-zero row keeps the floor scale
    q, scale = ops.quantize_per_token_head(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (tokens, heads)
    expected_scale = (x.double().abs().amax(-1) / 127).clamp(min=1e-6)
    torch.testing.assert_close(scale.double(), expected_scale, rtol=1e-6, atol=0)
    ratio = x.double() / scale.double().unsqueeze(-1)
    expected = (ratio.sign() * (ratio.abs() + 0.5).floor()).clamp(-128, 127)
    # float32 division may land a hair on the other side of a .5 boundary: allow one step there only
    off = (q.double() - expected).abs()
    assert off.max() <= 1 and bool(((off == 0) | ((ratio.abs() % 1 - 0.5).abs() < 1e-4)).all())
    nonzero = x.abs().amax(-1) > 0
    assert bool((q.abs().amax(-1)[nonzero] == 127).all())  # the largest value of a row maps to +-127
    assert bool(((q.double() * scale.double().unsqueeze(-1) - x.double()).abs()
                 <= scale.double().unsqueeze(-1) / 2 + 1e-5 * magnitude).all())


@settings(max_examples=20, deadline=None)
@given(kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]), block_size=st.sampled_from([4, 16]),
       lens=st.lists(st.integers(1, 30), min_size=1, max_size=3), seed=st.integers(0, 999))
def test_paged_decode_over_int8_pages_matches_naive_on_dequantised_kv(kv_heads, group, block_size, lens, seed):
    gen = torch.Generator().manual_seed(seed)
    dim, heads = 64, kv_heads * group
    per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(per_seq) + 3
    pages = torch.zeros(num_blocks, 1, block_size, token_bytes(kv_heads, dim, dim), dtype=torch.int8)
    caches = bsh_parts(pages, kv_heads, dim, dim)
    order = torch.randperm(num_blocks, generator=gen)[: sum(per_seq)]  # scattered, not contiguous, blocks
    tables, keys, values, start = [], [], [], 0
    for n, count in zip(lens, per_seq):
        blocks = order[start: start + count]
        start += count
        tables.append(torch.nn.functional.pad(blocks, (0, max(per_seq) - count)))
        k, v = torch.randn(n, kv_heads, dim, generator=gen), torch.randn(n, kv_heads, dim, generator=gen)
        slots = blocks.repeat_interleave(block_size)[:n] * block_size + torch.arange(n) % block_size
        kq, ks = ops.quantize_per_token_head(k)
        vq, vs = ops.quantize_per_token_head(v)
        ops.reshape_and_cache(kq, vq, caches.key, caches.value, slots)
        ops.reshape_and_cache(ks.unsqueeze(-1), vs.unsqueeze(-1), caches.key_scale.unsqueeze(-1),
                              caches.value_scale.unsqueeze(-1), slots)
        keys.append(kq.double() * ks.double().unsqueeze(-1))
        values.append(vq.double() * vs.double().unsqueeze(-1))
    block_table = torch.stack(tables).to(torch.int32)
    key_cache, value_cache, renumbered = _dequantized_blocks(caches, block_table, torch.float32)
    assert key_cache.shape[0] == torch.unique(block_table).numel()  # only referenced blocks are dequantised
    q = torch.randn(len(lens), heads, dim, generator=gen)
    scale = dim ** -0.5
    out = ops.paged_attention(q, key_cache, value_cache, renumbered, torch.tensor(lens, dtype=torch.int32), scale,
                              heads, kv_heads)
    for i, n in enumerate(lens):
        expected = naive(q[i: i + 1], keys[i], values[i], scale, [n - 1], n)
        torch.testing.assert_close(out[i: i + 1].double(), expected, rtol=1e-4, atol=1e-4)

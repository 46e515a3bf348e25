"""Reference ops vs independent oracles (naive float64 attention, torch SDPA).

Random shapes: GQA ratios, head dims, block sizes, ragged sequence lengths,
padding slots. A wrong slot mapping, mask or gather makes these fail.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops, provider_name
from ascend_kernel.errors import SettingsError
from ascend_kernel_plugins.attention.masks import AttentionMaskBuilder
from ascend_kernel_plugins.attention.states import AttentionState

ops = get_ops("reference", "cpu")


def naive(q, k, v, scale, q_pos, k_len):
    """float64 attention of queries at positions q_pos over keys [0, k_len), causal by position."""
    h = q.shape[1]
    k = k.double().repeat_interleave(h // k.shape[1], dim=1)
    v = v.double().repeat_interleave(h // v.shape[1], dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.double(), k[:k_len]) * scale
    allowed = torch.arange(k_len)[None, :] <= torch.as_tensor(q_pos)[:, None]
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v[:k_len])


shapes = st.fixed_dictionaries({
    "kv_heads": st.sampled_from([1, 2]),
    "group": st.sampled_from([1, 2, 4]),
    "head_dim": st.sampled_from([16, 64, 128]),
    "block_size": st.sampled_from([4, 16, 32]),
    "lens": st.lists(st.integers(1, 40), min_size=1, max_size=4),
    "seed": st.integers(0, 2**16),
})


def assert_last_tokens_match_naive(out, q, ks, vs, lens, q_lens):
    """Request r's ``q_lens[r]`` query rows are its last positions of ``lens[r]``; each equals naive attention."""
    start = 0
    for r, (n, ql) in enumerate(zip(lens, q_lens)):
        ref = naive(q[start:start + ql], ks[r], vs[r], 1 / math.sqrt(q.shape[-1]), list(range(n - ql, n)), n)
        torch.testing.assert_close(out[start:start + ql].double(), ref, rtol=1e-4, atol=1e-4)
        start += ql


def paged(cache_len_total, block_size, kv_heads, head_dim, lens, gen):
    """Random K/V per sequence written to random (shuffled) blocks of paged caches."""
    blocks_per = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables, i = [], 0
    width = max(blocks_per)
    for b in blocks_per:
        row = perm[i:i + b].tolist()
        tables.append(row + [0] * (width - b))
        i += b
    block_table = torch.tensor(tables, dtype=torch.int32)
    kc = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    vc = torch.zeros_like(kc)
    ks = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in lens]
    vs = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in lens]
    slots = torch.cat([
        torch.tensor([tables[r][t // block_size] * block_size + t % block_size for t in range(n)])
        for r, n in enumerate(lens)
    ])
    ops.reshape_and_cache(torch.cat(ks), torch.cat(vs), kc, vc, slots)
    return kc, vc, block_table, ks, vs


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_reshape_and_cache_places_every_token_and_skips_padding(s):
    gen = torch.Generator().manual_seed(s["seed"])
    kc, vc, table, ks, vs = paged(0, s["block_size"], s["kv_heads"], s["head_dim"], s["lens"], gen)
    bs = s["block_size"]
    for r, n in enumerate(s["lens"]):
        for t in range(n):
            blk = int(table[r, t // bs])
            assert torch.equal(kc[blk, t % bs], ks[r][t]) and torch.equal(vc[blk, t % bs], vs[r][t])
    written = sum(s["lens"])
    assert int((kc.abs().sum(dim=(-1, -2)) != 0).sum()) == written
    before = kc.clone()
    ops.reshape_and_cache(torch.ones(2, s["kv_heads"], s["head_dim"]), torch.ones(2, s["kv_heads"], s["head_dim"]),
                          kc, vc, torch.tensor([-1, -1]))
    assert torch.equal(kc, before)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_flash_attention_matches_sdpa_and_naive(s):
    gen = torch.Generator().manual_seed(s["seed"])
    h, kvh, d = s["kv_heads"] * s["group"], s["kv_heads"], s["head_dim"]
    total = sum(s["lens"])
    q, k, v = (torch.randn(total, n, d, generator=gen) for n in (h, kvh, kvh))
    mask = AttentionMaskBuilder().causal(max(s["lens"]), torch.float32, torch.device("cpu"))
    out = ops.flash_attention(q, k, v, mask, torch.tensor(s["lens"]), 1 / math.sqrt(d), h, kvh)
    start = 0
    for n in s["lens"]:
        sl = slice(start, start + n)
        ref = F.scaled_dot_product_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1),
                                             is_causal=True, enable_gqa=True).transpose(0, 1)
        torch.testing.assert_close(out[sl], ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out[sl].double(), naive(q[sl], k[sl], v[sl], 1 / math.sqrt(d), list(range(n)), n),
                                   rtol=1e-4, atol=1e-4)
        start += n


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_paged_decode_matches_naive(s):
    gen = torch.Generator().manual_seed(s["seed"])
    h, kvh, d = s["kv_heads"] * s["group"], s["kv_heads"], s["head_dim"]
    kc, vc, table, ks, vs = paged(0, s["block_size"], kvh, d, s["lens"], gen)
    q = torch.randn(len(s["lens"]), h, d, generator=gen)
    out = ops.paged_attention(q, kc, vc, table, torch.tensor(s["lens"]), 1 / math.sqrt(d), h, kvh)
    for r, n in enumerate(s["lens"]):
        ref = naive(q[r:r + 1], ks[r], vs[r], 1 / math.sqrt(d), [n - 1], n)
        torch.testing.assert_close(out[r:r + 1].double(), ref, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(shapes, st.data())
def test_splitfuse_matches_naive_for_chunks_over_cached_prefixes(s, data):
    gen = torch.Generator().manual_seed(s["seed"])
    h, kvh, d = s["kv_heads"] * s["group"], s["kv_heads"], s["head_dim"]
    lens = s["lens"]
    q_lens = [data.draw(st.integers(1, n)) for n in lens]  # the last q_len tokens are the new chunk
    kc, vc, table, ks, vs = paged(0, s["block_size"], kvh, d, lens, gen)
    q = torch.randn(sum(q_lens), h, d, generator=gen)
    positions = torch.cat([torch.arange(n - ql, n) for n, ql in zip(lens, q_lens)])
    mask = AttentionMaskBuilder().splitfuse(torch.tensor(lens), positions, torch.float32, torch.device("cpu"))
    out = ops.paged_attention_splitfuse(q, kc, vc, mask, table, torch.tensor(q_lens), torch.tensor(lens),
                                        1 / math.sqrt(d), h, kvh)
    assert_last_tokens_match_naive(out, q, ks, vs, lens, q_lens)


@settings(max_examples=25, deadline=None)
@given(kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]), block_size=st.sampled_from([16, 32]),
       lens=st.lists(st.integers(1, 300), min_size=1, max_size=3), seed=st.integers(0, 9999), data=st.data())
def test_prefill_over_cached_prefix_with_the_compressed_mask_matches_naive(kv_heads, group, block_size, lens,
                                                                           seed, data):
    from ascend_kernel_plugins.attention.masks import CACHE_HIT_MASK_SIZE

    gen = torch.Generator().manual_seed(seed)
    h, d = kv_heads * group, 64
    q_lens = [data.draw(st.integers(1, n)) for n in lens]  # long prefixes cross several 128-token mask tiles
    kc, vc, table, ks, vs = paged(0, block_size, kv_heads, d, lens, gen)
    q = torch.randn(sum(q_lens), h, d, generator=gen)
    mask = AttentionMaskBuilder().mask_for(AttentionState.PrefillCacheHit, torch.tensor(lens), torch.empty(0),
                                           torch.float32, torch.device("cpu"))
    assert mask.shape == (CACHE_HIT_MASK_SIZE, CACHE_HIT_MASK_SIZE)
    out = ops.flash_attention_qlens(q, kc, vc, table, mask, torch.tensor(q_lens), torch.tensor(lens),
                                    1 / math.sqrt(d), h, kv_heads)
    assert_last_tokens_match_naive(out, q, ks, vs, lens, q_lens)
    tile = CACHE_HIT_MASK_SIZE
    shares_tile = any((p // tile) == ((p + 1) // tile) for n, ql in zip(lens, q_lens) for p in range(n - ql, n - 1))
    if shares_tile:  # the tile is honoured: an all-visible tile lets a new token see a later one
        loose = ops.flash_attention_qlens(q, kc, vc, table, torch.zeros_like(mask), torch.tensor(q_lens),
                                          torch.tensor(lens), 1 / math.sqrt(d), h, kv_heads)
        assert not torch.allclose(loose, out, atol=1e-4)


def test_rms_norm_matches_formula():
    x, w = torch.randn(5, 64), torch.randn(64)
    y, rstd = ops.rms_norm(x, w, 1e-6)
    ref = x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    assert rstd.shape == (5, 1)


@pytest.mark.parametrize("neox", [True, False])
def test_rotary_matches_complex_rotation(neox):
    T, H, D = 6, 2, 16
    pos = torch.tensor([0, 3, 1, 7, 2, 5])
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).double() / D))
    ang = torch.arange(16).double()[:, None] * inv[None]
    cache = torch.cat([ang.cos(), ang.sin()], -1).float()
    q, k = torch.randn(T, H * D), torch.randn(T, H * D)
    q0, k0 = q.clone(), k.clone()
    ops.rotary_embedding(pos, q, k, D, cache, neox)
    for x0, x in ((q0, q), (k0, k)):
        v = x0.view(T, H, D).double()
        pairs = torch.stack(v.chunk(2, -1), -1) if neox else v.view(T, H, D // 2, 2)
        z = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(ang[pos]), ang[pos])[:, None]
        r = torch.view_as_real(z)
        expect = torch.cat([r[..., 0], r[..., 1]], -1) if neox else r.flatten(-2)
        torch.testing.assert_close(x.view(T, H, D).double(), expect, rtol=1e-5, atol=1e-5)


def test_provider_choice():
    assert provider_name("auto", "cpu") == "reference"
    assert provider_name("auto", "npu") == "torch_npu"
    with pytest.raises(SettingsError, match="needs an NPU"):
        provider_name("torch_npu", "cpu")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([4, 16]), st.lists(st.integers(1, 40), min_size=1, max_size=4),
       st.integers(0, 2**16))
def test_mla_decode_matches_naive_latent_attention(heads, block_size, lens, seed):
    gen = torch.Generator().manual_seed(seed)
    rank, rope = 32, 8
    cache, _, table, latents, _ = paged(0, block_size, 1, rank + rope, lens, gen)
    q = torch.randn(len(lens), heads, rank + rope, generator=gen)
    scale = 0.3
    out = ops.paged_attention_mla(q, cache, table, torch.tensor(lens), scale, heads, rank)
    for r, n in enumerate(lens):
        keys = latents[r][:, 0].double()  # [n, rank + rope]: latent (nope) then rotary key (rope)
        probs = (q[r].double() @ keys.T * scale).softmax(-1)  # [heads, n]
        torch.testing.assert_close(out[r].double(), probs @ keys[:, :rank], rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([4, 16]), st.lists(st.integers(1, 30), min_size=1, max_size=3),
       st.integers(1, 12), st.integers(0, 2**16), st.data())
def test_sfa_indexer_and_sparse_attention_match_naive(groups, block_size, lens, topk, seed, data):
    gen = torch.Generator().manual_seed(seed)
    dim, rank, rope, heads = 16, 32, 8, 2
    q_lens = [data.draw(st.integers(1, n)) for n in lens]
    index_cache, _, table, index_keys, _ = paged(0, block_size, 1, dim, lens, gen)
    # the latent cache lives on the same blocks as the indexer cache (one block table)
    latents = [torch.randn(n, 1, rank + rope, generator=gen) for n in lens]
    latent_cache = torch.zeros(index_cache.shape[0], block_size, 1, rank + rope)
    slots = torch.cat([torch.tensor([int(table[r, t // block_size]) * block_size + t % block_size for t in range(n)])
                       for r, n in enumerate(lens)])
    ops.reshape_and_cache(torch.cat(latents)[:, :, :rank], torch.cat(latents)[:, :, rank:],
                          latent_cache[..., :rank], latent_cache[..., rank:], slots)
    T = sum(q_lens)
    q_idx = torch.randn(T, groups, dim, generator=gen)
    w = torch.rand(T, groups, generator=gen)
    selected = ops.lightning_indexer(q_idx, index_cache, w, torch.tensor(q_lens), torch.tensor(lens), table, topk)
    q, q_rope = torch.randn(T, heads, rank, generator=gen), torch.randn(T, heads, rope, generator=gen)
    out = ops.sparse_attention_mla(q, q_rope, latent_cache[..., :rank], latent_cache[..., rank:], selected,
                                   torch.tensor(q_lens), table, torch.tensor(lens), 0.2)
    start = 0
    for r, (n, ql) in enumerate(zip(lens, q_lens)):
        keys = index_keys[r][:, 0].double()
        for t in range(ql):
            pos = n - ql + t
            scores = (torch.relu(q_idx[start + t].double() @ keys[: pos + 1].T) * w[start + t, :, None]).sum(0)
            want = set(scores.topk(min(topk, pos + 1)).indices.tolist())
            got = selected[start + t]
            assert set(got[got >= 0].tolist()) == want and int((got < 0).sum()) == topk - len(want)
            lat = latents[r][:, 0].double()[sorted(want)]
            qq = torch.cat([q[start + t], q_rope[start + t]], -1).double()
            probs = (qq @ lat.T * 0.2).softmax(-1)
            torch.testing.assert_close(out[start + t].double(), probs @ lat[:, :rank], rtol=1e-4, atol=1e-4)
        start += ql


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 20)), min_size=1, max_size=3), st.booleans(),
       st.integers(0, 2**16))
def test_ragged_attention_lse_matches_naive_and_merges(reqs, causal, seed):
    """Per request: q_len queries over q_len + prefix keys; lse lets two halves merge to the whole."""
    gen = torch.Generator().manual_seed(seed)
    heads, dq, dv = 2, 24, 16
    q_lens = [q for q, _ in reqs]
    kv_lens = [q + p for q, p in reqs]
    q = torch.randn(sum(q_lens), heads, dq, generator=gen)
    k = torch.randn(sum(kv_lens), heads, dq, generator=gen)
    v = torch.randn(sum(kv_lens), heads, dv, generator=gen)
    cu = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()])  # noqa: E731
    out, lse = ops.ragged_attention_lse(q, k, v, cu(q_lens), cu(kv_lens), 0.25, causal)
    qs, ks = cu(q_lens).tolist(), cu(kv_lens).tolist()
    for r, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        s = torch.einsum("nhd,mhd->hnm", q[qs[r]:qs[r + 1]].double(), k[ks[r]:ks[r + 1]].double()) * 0.25
        if causal:
            s = s.masked_fill(torch.ones(ql, kl, dtype=torch.bool).triu(1 + kl - ql), float("-inf"))
        torch.testing.assert_close(lse[:, qs[r]:qs[r + 1]].double(), torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)
        ref = torch.einsum("hnm,mhd->nhd", s.softmax(-1), v[ks[r]:ks[r + 1]].double())
        torch.testing.assert_close(out[qs[r]:qs[r + 1]].double(), ref, rtol=1e-4, atol=1e-4)
    if not causal and all(p > 0 for _, p in reqs):
        # split each request's keys into prefix / rest and merge the two partial results by lse
        pre = [p for _, p in reqs]
        rest = [q for q, _ in reqs]
        idx_pre = torch.cat([torch.arange(ks[r], ks[r] + pre[r]) for r in range(len(reqs))])
        idx_rest = torch.cat([torch.arange(ks[r] + pre[r], ks[r + 1]) for r in range(len(reqs))])
        o1, l1 = ops.ragged_attention_lse(q, k[idx_pre], v[idx_pre], cu(q_lens), cu(pre), 0.25, False)
        o2, l2 = ops.ragged_attention_lse(q, k[idx_rest], v[idx_rest], cu(q_lens), cu(rest), 0.25, False)
        m = torch.logaddexp(l1, l2)
        merged = o1 * (l1 - m).exp().T[..., None] + o2 * (l2 - m).exp().T[..., None]
        torch.testing.assert_close(merged, out, rtol=1e-4, atol=1e-5)

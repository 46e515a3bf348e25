"""The Ascend SFA backend at the backend level: builder + ``forward_sparse`` over persistent caches.

Multi-step scenarios (ragged prompts, decodes, a padded decode, a mixed
chunked-prefill step) go through real ``CommonAttentionMetadata`` objects and
the metadata builder, and the output of every step is compared with a float64
oracle written here from the definition of DeepSeek-V3.2 sparse attention
(never through the ops seam): per request it keeps the full history of
latents, rotary keys and indexer keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata, MultipleOf

from ascend_kernel.ops.reference import ReferenceOps
from ascend_kernel_plugins.attention.ascend.sfa import (
    AscendSFABackend,
    AscendSFAImpl,
    AscendSFAMetadata,
    AscendSFAMetadataBuilder,
)
from ascend_kernel_plugins.attention.states import AttentionState, StandardStatePolicy

H, RANK, ROPE, G, DI = 4, 32, 16, 2, 16
BLOCK_SIZE = 16
NUM_BLOCKS = 40
MAX_BLOCKS_PER_REQ = 4  # 64 tokens per request at most
SCALE = 1.0 / math.sqrt(RANK + ROPE)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tensors here are tiny: intra-op threads only add spin-waits on a loaded 2-core host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- the oracle

def select_topk(index_q, weights, index_keys, sparse_count, relu=True):
    """Positions kept for one query token over keys 0..p (index_keys [p+1, Di], float64)."""
    dots = index_keys @ index_q.T  # [p+1, G]
    scores = ((dots.clamp_min(0) if relu else dots) * weights).sum(-1)
    k = min(sparse_count, scores.numel())
    ordered = scores.sort(descending=True).values
    if k < scores.numel():  # the selection must be unambiguous for the comparison to mean anything
        assert ordered[k - 1] - ordered[k] > 1e-6, "tied indexer scores at the top-k boundary: change the data"
    return scores.topk(k).indices


def latent_attention(q_nope, q_pe, kv_c, k_pe, positions):
    """softmax(scale * [q_nope|q_pe] . [kv_c_j|k_pe_j]) over ``positions``, averaging kv_c_j -> [H, RANK]."""
    q = torch.cat([q_nope, q_pe], -1)  # [H, RANK + ROPE]
    keys = torch.cat([kv_c, k_pe], -1)[positions]  # [m, RANK + ROPE]
    probs = (q @ keys.T * SCALE).softmax(-1)
    return probs @ kv_c[positions]


@dataclass
class History:
    kv_c: list = field(default_factory=list)
    k_pe: list = field(default_factory=list)
    index_k: list = field(default_factory=list)


def record(histories, step):
    """Append the step's new tokens (float64) to their requests' histories."""
    for r, start, q_len in step["reqs"]:
        h = histories.setdefault(r, History())
        for t in range(start, start + q_len):
            h.kv_c.append(step["kv_c"][t].double())
            h.k_pe.append(step["k_pe"][t].double())
            h.index_k.append(step["index_k"][t].double())


def oracle_step(histories, step, sparse_count, relu=True):
    """Sparse attention of each query token of ``step``; histories must already hold the step."""
    out = torch.zeros(step["total"], H, RANK, dtype=torch.float64)
    for r, start, q_len in step["reqs"]:
        h = histories[r]
        kv_c, k_pe, index_k = torch.stack(h.kv_c), torch.stack(h.k_pe), torch.stack(h.index_k)
        for i, t in enumerate(range(start, start + q_len)):
            p = len(h.kv_c) - q_len + i  # position of this query token in its request
            keep = select_topk(step["index_q"][t].double(), step["index_w"][t].double(), index_k[: p + 1],
                               sparse_count, relu)
            out[t] = latent_attention(step["q_nope"][t].double(), step["q_pe"][t].double(), kv_c, k_pe, keep)
    return out


def dense_step(histories, step):
    """Dense causal latent attention (every position 0..p); histories must already hold the step."""
    out = torch.zeros(step["total"], H, RANK, dtype=torch.float64)
    for r, start, q_len in step["reqs"]:
        h = histories[r]
        kv_c, k_pe = torch.stack(h.kv_c), torch.stack(h.k_pe)
        for i, t in enumerate(range(start, start + q_len)):
            p = len(h.kv_c) - q_len + i
            q = torch.cat([step["q_nope"][t], step["q_pe"][t]], -1).double()
            keys = torch.cat([kv_c, k_pe], -1)[: p + 1]
            out[t] = (q @ keys.T * SCALE).softmax(-1) @ kv_c[: p + 1]
    return out


# ---------------------------------------------------------------- the scenario driver

class Scenario:
    """Requests with their own non-contiguous blocks, persistent caches, step-by-step batches."""

    def __init__(self, seed, ops=None):
        self.gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(NUM_BLOCKS, generator=self.gen).tolist()
        self.blocks = {}  # request -> its block ids, in order
        self._free = perm
        self.computed = {}  # request -> tokens already in the cache
        self.nope = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 1, RANK)
        self.rope = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 1, ROPE)
        self.index = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 1, DI)
        self.builder = AscendSFAMetadataBuilder(None, ["model.layers.0.self_attn.attn"], None, torch.device("cpu"),
                                                decide_state=StandardStatePolicy(True).decide)
        self.impl = make_impl(ops if ops is not None else ReferenceOps())
        self.histories = {}

    def _blocks_for(self, r):
        if r not in self.blocks:
            self.blocks[r] = [self._free.pop() for _ in range(MAX_BLOCKS_PER_REQ)]
            self.computed[r] = 0
        return self.blocks[r]

    def common_metadata(self, schedule, pad_tokens=0):
        """vLLM's per-step metadata for ``schedule`` = [(request, new tokens), ...]."""
        table = torch.tensor([self._blocks_for(r) for r, _ in schedule], dtype=torch.int32)
        q_lens = [q for _, q in schedule]
        seq_lens = [self.computed[r] + q for r, q in schedule]
        starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        slots = []
        for (r, q), s in zip(schedule, seq_lens):
            for pos in range(s - q, s):
                slots.append(self.blocks[r][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        slots += [-1] * pad_tokens
        return CommonAttentionMetadata(
            query_start_loc=starts.clone(),
            query_start_loc_cpu=starts,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            num_reqs=len(schedule),
            num_actual_tokens=sum(q_lens) + pad_tokens,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
        )

    def random_step(self, schedule, pad_tokens=0):
        total = sum(q for _, q in schedule) + pad_tokens
        g = self.gen
        reqs, start = [], 0
        for r, q in schedule:
            reqs.append((r, start, q))
            start += q
        # Indexer head 0 and the keys get an offset, so head 0's dot products are almost always
        # positive and no two positions tie at score 0 (see select_topk); head 1 is centred, so
        # relu cuts about half of its dot products and changes the ranking.
        index_q = torch.randn(total, G, DI, generator=g)
        index_q[:, 0] += 1.0
        return {
            "reqs": reqs,
            "total": total,
            "q_nope": torch.randn(total, H, RANK, generator=g),
            "q_pe": torch.randn(total, H, ROPE, generator=g),
            "kv_c": torch.randn(total, RANK, generator=g),
            "k_pe": torch.randn(total, ROPE, generator=g),
            "index_q": index_q,
            "index_k": torch.randn(total, DI, generator=g) + 1.0,
            "index_w": torch.rand(total, G, generator=g) + 0.1,
        }

    def run(self, schedule, sparse_count, pad_tokens=0):
        """One step through the builder and the impl; returns (metadata, step data, backend output).

        The step's tokens are then added to the oracle's histories (test-side bookkeeping only)."""
        meta = self.builder.build(0, self.common_metadata(schedule, pad_tokens))
        step = self.random_step(schedule, pad_tokens)
        out = self.impl.forward_sparse(step["q_nope"], step["q_pe"], step["kv_c"], step["k_pe"], step["index_q"],
                                       step["index_k"], step["index_w"], self.nope, self.rope, self.index, meta,
                                       SCALE, sparse_count)
        for r, q in schedule:
            self.computed[r] += q
        record(self.histories, step)
        return meta, step, out


def make_impl(ops):
    return AscendSFAImpl(
        num_heads=H, head_size=RANK + ROPE, scale=SCALE, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
        kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
        kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=RANK, qk_nope_head_dim=RANK,
        qk_rope_head_dim=ROPE, qk_head_dim=RANK + ROPE, v_head_dim=RANK, kv_b_proj=None, ops=ops,
    )


#: (schedule, padding tokens, expected state): prompts 21 / 7 / 34 tokens, two
#: decodes (the second padded like a captured graph's batch), then request 3
#: arrives and prefills a 40-token prompt in chunks of 24 and 16 while the
#: others decode (request 1 is done after the first mixed step).
STEPS = [
    ([(0, 21), (1, 7), (2, 34)], 0, AttentionState.PrefillNoCache),
    ([(0, 1), (1, 1), (2, 1)], 0, AttentionState.DecodeOnly),
    ([(0, 1), (1, 1), (2, 1)], 3, AttentionState.DecodeOnly),
    ([(0, 1), (1, 1), (2, 1), (3, 24)], 0, AttentionState.ChunkedPrefill),
    ([(2, 1), (0, 1), (3, 16)], 0, AttentionState.ChunkedPrefill),
    ([(0, 1), (3, 1), (2, 1)], 0, AttentionState.DecodeOnly),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sparse_count", [8, 13])
def test_multi_step_sfa_matches_float64_oracle(seed, sparse_count):
    sc = Scenario(seed)
    truncated = 0  # query tokens that see more positions than sparse_count
    for schedule, pad, expected_state in STEPS:
        meta, step, out = sc.run(schedule, sparse_count, pad)
        assert isinstance(meta, AscendSFAMetadata) and meta.attn_state is expected_state
        assert meta.query_lens.tolist() == [q for _, q in schedule]
        assert meta.seq_lens.tolist() == [sc.computed[r] for r, _ in schedule]
        want = oracle_step(sc.histories, step, sparse_count)
        assert out.shape == (step["total"], H, RANK)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
        real = step["total"] - pad
        assert torch.count_nonzero(out[real:]) == 0  # padding rows stay zero
        truncated += sum(max(0, sc.computed[r] - max(sparse_count, sc.computed[r] - q)) for r, q in schedule)
    assert truncated > 40  # top-k really dropped positions for many query tokens


def test_every_token_lands_in_its_slot_and_padding_writes_nothing():
    sc = Scenario(3)
    for schedule, pad, _ in STEPS[:3]:
        _, step, _ = sc.run(schedule, 8, pad)
    for r, h in sc.histories.items():
        for pos, (kv, pe, ik) in enumerate(zip(h.kv_c, h.k_pe, h.index_k)):
            blk, off = sc.blocks[r][pos // BLOCK_SIZE], pos % BLOCK_SIZE
            assert torch.equal(sc.nope[blk, off, 0].double(), kv)
            assert torch.equal(sc.rope[blk, off, 0].double(), pe)
            assert torch.equal(sc.index[blk, off, 0].double(), ik)
    written = sum(len(h.kv_c) for h in sc.histories.values())
    assert int((sc.nope.abs().sum(dim=(-1, -2)) != 0).sum()) == written
    assert int((sc.index.abs().sum(dim=(-1, -2)) != 0).sum()) == written


def test_oracle_is_sensitive_to_topk_and_relu():
    """Large sparse_count = dense causal attention; small differs from dense; relu changes selections."""
    dense_sc, sparse_sc = Scenario(5), Scenario(5)  # same seed: same blocks, same data
    big, small = 1000, 6
    relu_mattered = truncated = differs = 0
    for schedule, pad, _ in STEPS:
        _, step, out_big = dense_sc.run(schedule, big, pad)
        _, step_s, out_small = sparse_sc.run(schedule, small, pad)
        assert torch.equal(step["q_nope"], step_s["q_nope"])
        dense = dense_step(dense_sc.histories, step)
        torch.testing.assert_close(out_big.double(), dense, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out_small.double(), oracle_step(sparse_sc.histories, step_s, small),
                                   rtol=1e-4, atol=1e-4)
        # only tokens with more than `small` visible positions can differ from dense
        for r, start, q_len in step["reqs"]:
            h = dense_sc.histories[r]
            index_k = torch.stack(h.index_k)
            for i, t in enumerate(range(start, start + q_len)):
                p = len(h.kv_c) - q_len + i
                diff = (out_small[t].double() - dense[t]).abs().max()
                if p + 1 <= small:
                    assert diff < 1e-4
                    continue
                truncated += 1
                differs += bool(diff > 1e-3)
                args = (step["index_q"][t].double(), step["index_w"][t].double(), index_k[: p + 1], small)
                relu_mattered += set(select_topk(*args).tolist()) != set(select_topk(*args, relu=False).tolist())
    assert truncated > 40 and differs >= 0.9 * truncated
    assert relu_mattered > 0.1 * truncated


class RecordingOps:
    """Passes every call to the reference provider and records which ops the impl used."""

    def __init__(self):
        self.inner = ReferenceOps()
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return fn(*args, **kwargs)

        return call


def test_impl_goes_through_the_ops_seam_only():
    ops = RecordingOps()
    sc = Scenario(7, ops=ops)
    sc.run([(0, 5), (1, 3)], 4)
    assert ops.calls == ["reshape_and_cache", "write_cache", "lightning_indexer", "sparse_attention_mla"]
    with pytest.raises(RuntimeError, match="topk_indices_buffer"):  # vLLM's entry needs its indexer's buffer
        sc.impl.forward_mqa(None, torch.empty(0), None, None)


def test_builder_takes_the_runner_published_state(monkeypatch):
    from ascend_kernel.runner import kernel_runner

    sc = Scenario(9)
    common = sc.common_metadata([(0, 4), (1, 1)])
    assert sc.builder.build(0, common).attn_state is AttentionState.PrefillNoCache  # policy: all new
    published = kernel_runner.StepOutcome(AttentionState.SpecDecoding, "SpecDecoding", False, None, None)
    monkeypatch.setattr(kernel_runner.LIVE, "outcome", published)
    assert sc.builder.build(0, common).attn_state is AttentionState.SpecDecoding


def test_backend_class_declarations():
    b = AscendSFABackend
    assert b.get_name() == "ASCEND_SFA"
    assert b.is_mla() and b.is_sparse()
    assert all(b.supports_dtype(d) for d in (torch.float16, torch.bfloat16, torch.float32))
    assert not b.supports_dtype(torch.float64)
    sizes = b.get_supported_kernel_block_sizes()
    assert len(sizes) == 1 and isinstance(sizes[0], MultipleOf) and sizes[0].base == 16
    assert b.supports_block_size(16) and b.supports_block_size(128) and not b.supports_block_size(8)
    assert b.graph_capture_support == "full_decode_only"
    assert b.get_builder_cls() is AscendSFAMetadataBuilder and b.get_impl_cls() is AscendSFAImpl
    assert AscendSFAImpl.is_sparse and not AscendSFAImpl.supports_dense_mha_prefill
    with pytest.raises(NotImplementedError):
        AscendSFAImpl(num_heads=H, head_size=RANK + ROPE, scale=SCALE, num_kv_heads=1, alibi_slopes=None,
                      sliding_window=128, kv_cache_dtype="auto", logits_soft_cap=None,
                      attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, q_lora_rank=None,
                      kv_lora_rank=RANK, qk_nope_head_dim=RANK, qk_rope_head_dim=ROPE, qk_head_dim=RANK + ROPE,
                      v_head_dim=RANK, kv_b_proj=None, ops=ReferenceOps())


def test_forward_mqa_attends_over_the_indexer_buffer_like_forward_sparse():
    """vLLM's entry point: the latent cache as one [blocks, block_size, rank + rope] tensor, the
    selection from ``topk_indices_buffer``; the result equals forward_sparse's for the same step."""
    sc = Scenario(11)
    latent = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, RANK + ROPE)  # the layer's MLA cache, split by views
    sc.nope, sc.rope = latent.unsqueeze(2)[..., :RANK], latent.unsqueeze(2)[..., RANK:]
    sparse_count = 8
    for schedule, pad, _ in STEPS[:4]:
        meta, step, expected = sc.run(schedule, sparse_count, pad)
        assert (meta.num_decode_tokens, meta.num_prefills, meta.prefill) == (0, len(schedule), None)
        real = sum(q for _, q in schedule)
        buffer = torch.full((64, sparse_count), -1, dtype=torch.int32)  # vLLM's buffer is sized for max tokens
        buffer[:real] = sc.impl.ops.lightning_indexer(step["index_q"][:real], sc.index, step["index_w"][:real],
                                                      meta.query_lens, meta.seq_lens,
                                                      meta.block_table.to(torch.int32), sparse_count)
        mqa = make_impl(ReferenceOps())
        mqa.topk_indices_buffer = buffer
        out, lse = mqa.forward_mqa((step["q_nope"], step["q_pe"]), latent, meta, None)
        assert lse is None
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        concatenated, _ = mqa.forward_mqa(torch.cat([step["q_nope"], step["q_pe"]], -1), latent, meta, None)
        torch.testing.assert_close(concatenated, expected, rtol=1e-5, atol=1e-5)
    assert int((latent.abs().sum(-1) != 0).sum()) == sum(len(h.kv_c) for h in sc.histories.values())

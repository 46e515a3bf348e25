"""The seam's MoE ops (reference provider) vs naive float64 loops written here, and vLLM's SiluAndMul.

The round trip splits the experts over two simulated ranks (disjoint
``active_expert_range``s) and checks that the two partial outputs add up to a
dense loop over every token's chosen experts. The torch_npu provider cannot
run here: it is checked to import without torch_npu, to offer the same ops,
and (with a stand-in for torch_npu written from the kernels' documented
contracts) to adapt those contracts to the seam's.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops

ops = get_ops("reference", "cpu")
MOE_OPS = ("moe_gating_top_k_softmax", "moe_init_routing", "grouped_matmul", "swiglu", "moe_token_unpermute")


def naive_gating(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    weights, ids = [], []
    for row in logits.double().tolist():
        top = max(row)
        exps = [math.exp(v - top) for v in row]
        probs = [e / sum(exps) for e in exps]
        best = sorted(range(len(row)), key=lambda e: -probs[e])[:k]
        weights.append([probs[e] for e in best])
        ids.append(best)
    return weights, ids


def naive_routing(topk_ids: torch.Tensor, start: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """(pair number of each kept row in order, row of each pair or -1, count per expert of the range)."""
    flat = topk_ids.reshape(-1).tolist()
    kept_pairs = [i for e in range(start, end) for i, fe in enumerate(flat) if fe == e]
    row_of = [-1] * len(flat)
    for p, i in enumerate(kept_pairs):
        row_of[i] = p
    return kept_pairs, row_of, [flat.count(e) for e in range(start, end)]


def naive_silu_mul(h: torch.Tensor) -> torch.Tensor:
    half = h.shape[-1] // 2
    gate, up = h[..., :half].double(), h[..., half:].double()
    return gate / (1 + torch.exp(-gate)) * up


# ---------------------------------------------------------------- gating


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 6), st.integers(1, 12), st.data(), st.sampled_from([torch.float32, torch.bfloat16]),
       st.integers(0, 2**16))
def test_gating_is_float32_softmax_then_descending_top_k(tokens, experts, data, dtype, seed):
    k = data.draw(st.integers(1, experts))
    gen = torch.Generator().manual_seed(seed)
    # distinct logits, exact in bf16 (multiples of 1/4), so the top-k has no ties
    ranks = torch.rand(tokens, experts, generator=gen).argsort(-1)
    logits = (ranks.float() * 0.25 - 1.0).to(dtype)
    weights, ids = ops.moe_gating_top_k_softmax(logits, k)
    assert weights.shape == ids.shape == (tokens, k)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    want_w, want_ids = naive_gating(logits, k)
    assert ids.tolist() == want_ids
    torch.testing.assert_close(weights.double(), torch.tensor(want_w, dtype=torch.float64).reshape(tokens, k),
                               rtol=1e-6, atol=1e-7)
    assert (weights[:, :-1] >= weights[:, 1:]).all()
    if k == experts and tokens:  # not renormalised, but all experts' weights are the whole softmax
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens))


def test_gating_of_random_logits_and_no_renormalisation():
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    weights, ids = ops.moe_gating_top_k_softmax(logits, 2)
    want_w, want_ids = naive_gating(logits, 2)
    assert ids.tolist() == want_ids
    torch.testing.assert_close(weights.double(), torch.tensor(want_w, dtype=torch.float64))
    assert (weights.sum(-1) < 1 - 1e-3).all()


# ---------------------------------------------------------------- routing


def check_routing(x, topk_ids, num_experts, start, end):
    expanded_x, row_idx, counts = ops.moe_init_routing(x, topk_ids, num_experts, (start, end))
    kept_pairs, row_of, want_counts = naive_routing(topk_ids, start, end)
    k = topk_ids.shape[1]
    assert expanded_x.shape == (len(kept_pairs), x.shape[1]) and expanded_x.dtype == x.dtype
    for p, i in enumerate(kept_pairs):
        assert torch.equal(expanded_x[p], x[i // k])
    assert row_idx.dtype == torch.int32 and row_idx.tolist() == row_of
    assert counts.dtype == torch.int64 and counts.tolist() == want_counts
    return expanded_x, row_idx, counts


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 8), st.integers(1, 4), st.integers(1, 8), st.data(), st.integers(0, 2**16))
def test_init_routing_groups_kept_pairs_by_expert_in_pair_order(tokens, k, experts, data, seed):
    gen = torch.Generator().manual_seed(seed)
    topk_ids = torch.randint(0, experts, (tokens, k), generator=gen, dtype=torch.int32)  # repeats allowed
    start = data.draw(st.integers(0, experts))
    end = data.draw(st.integers(start, experts))
    x = torch.randn(tokens, 6, generator=gen)
    check_routing(x, topk_ids, experts, start, end)


@pytest.mark.parametrize("start, end", [(0, 6), (0, 0), (6, 6), (1, 4), (4, 6), (5, 6)])
def test_init_routing_uneven_loads_and_idle_experts(start, end):
    # experts 0 and 5 get nothing, 2 gets a token twice, 3 is the busiest
    topk_ids = torch.tensor([[3, 2], [2, 3], [1, 3], [2, 2], [4, 3]], dtype=torch.int32)
    x = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
    expanded_x, row_idx, counts = check_routing(x, topk_ids, 6, start, end)
    if (start, end) == (0, 6):
        assert counts.tolist() == [0, 1, 4, 4, 1, 0]
        assert row_idx.tolist() == [5, 1, 2, 6, 0, 7, 3, 4, 9, 8]
    if start == end:
        assert expanded_x.shape == (0, 3) and (row_idx == -1).all() and counts.numel() == 0


def test_init_routing_rejects_a_range_outside_the_experts():
    with pytest.raises(ValueError, match="active_expert_range"):
        ops.moe_init_routing(torch.zeros(1, 2), torch.zeros(1, 1, dtype=torch.int32), 4, (2, 5))


# ---------------------------------------------------------------- grouped matmul


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.integers(0, 3), st.integers(0, 2**16))
def test_grouped_matmul_multiplies_each_group_by_its_weight_and_zeroes_the_rest(counts, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, K, N = sum(counts) + extra, 7, 5
    x = torch.randn(rows, K, generator=gen)
    weight = torch.randn(len(counts), K, N, generator=gen)
    out = ops.grouped_matmul(x, weight, torch.tensor(counts, dtype=torch.int64))
    assert out.shape == (rows, N) and out.dtype == x.dtype
    group_of_row = [g for g, c in enumerate(counts) for _ in range(c)]
    for r in range(rows):
        want = x[r].double() @ weight[group_of_row[r]].double() if r < len(group_of_row) else torch.zeros(N).double()
        torch.testing.assert_close(out[r].double(), want, rtol=1e-5, atol=1e-5)
    if extra:
        assert (out[sum(counts):] == 0).all()


def test_grouped_matmul_rejects_counts_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        ops.grouped_matmul(torch.zeros(3, 2), torch.zeros(2, 2, 2), torch.tensor([2, 2]))


# ---------------------------------------------------------------- swiglu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 9])
def test_swiglu_is_silu_of_the_first_half_times_the_second(rows, dtype):
    from vllm.model_executor.layers.activation import SiluAndMul

    x = (torch.randn(rows, 2 * 12, generator=torch.Generator().manual_seed(rows)) * 3).to(dtype)
    out = ops.swiglu(x)
    assert out.shape == (rows, 12) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), naive_silu_mul(x), rtol=tol, atol=tol)
    torch.testing.assert_close(out, SiluAndMul.forward_native(x), rtol=tol, atol=tol)  # vLLM's own layout


# ---------------------------------------------------------------- unpermute


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 6), st.integers(1, 3), st.integers(0, 2**16))
def test_unpermute_sums_each_tokens_weighted_rows_and_skips_dropped_pairs(dtype, tokens, k, seed):
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(tokens * k, generator=gen) < 0.6
    n = int(keep.sum())
    row_idx = torch.full((tokens * k,), -1, dtype=torch.int32)
    row_idx[keep] = torch.randperm(n, generator=gen).to(torch.int32)  # any placement of the kept pairs
    expanded_out = torch.randn(n, 4, generator=gen).to(dtype)
    weights = torch.rand(tokens, k, generator=gen)
    out = ops.moe_token_unpermute(expanded_out, row_idx, weights)
    assert out.shape == (tokens, 4) and out.dtype == dtype
    want = torch.zeros(tokens, 4, dtype=torch.float64)
    for t in range(tokens):
        for j in range(k):
            p = int(row_idx[t * k + j])
            if p >= 0:
                want[t] += float(weights[t, j]) * expanded_out[p].double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


# ---------------------------------------------------------------- the composed layer


def dense_moe(x, topk_ids, topk_weights, w13, w2):
    """Per token, per chosen expert: weight * down(silu(gate x) * up x), in float64."""
    out = torch.zeros(x.shape[0], w2.shape[-1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            h = x[t].double() @ w13[e].double()
            out[t] += float(topk_weights[t, j]) * (naive_silu_mul(h) @ w2[e].double())
    return out


def expert_parallel_moe(provider, x, topk_ids, topk_weights, w13, w2, split):
    """Two ranks own experts [0, split) and [split, E); their partial outputs are summed (the all-reduce)."""
    experts, total = w13.shape[0], None
    for start, end in ((0, split), (split, experts)):
        expanded_x, row_idx, counts = provider.moe_init_routing(x, topk_ids, experts, (start, end))
        h = provider.grouped_matmul(expanded_x, w13[start:end], counts)
        h = provider.grouped_matmul(provider.swiglu(h), w2[start:end], counts)
        partial = provider.moe_token_unpermute(h, row_idx, topk_weights)
        total = partial if total is None else total + partial
    return total


def moe_inputs(tokens, experts, k, seed, hidden=8, inter=6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    weights, ids = ops.moe_gating_top_k_softmax(torch.randn(tokens, experts, generator=gen), k)
    weights = weights / weights.sum(-1, keepdim=True)  # the caller renormalises
    w13 = torch.randn(experts, hidden, 2 * inter, generator=gen) / math.sqrt(hidden)
    w2 = torch.randn(experts, inter, hidden, generator=gen) / math.sqrt(inter)
    return x, ids, weights, w13, w2


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 9), st.integers(1, 8), st.data(), st.integers(0, 2**16))
def test_two_ranks_partial_outputs_sum_to_the_dense_moe(tokens, experts, data, seed):
    k = data.draw(st.integers(1, experts))
    split = data.draw(st.integers(0, experts))  # 0 or E: one rank holds every expert
    x, ids, weights, w13, w2 = moe_inputs(tokens, experts, k, seed)
    out = expert_parallel_moe(ops, x, ids, weights, w13, w2, split)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), dense_moe(x, ids, weights, w13, w2), rtol=1e-4, atol=1e-5)


def test_empty_batch_round_trip():
    x, ids, weights, w13, w2 = moe_inputs(0, 4, 2, 0)
    assert ids.shape == (0, 2)
    out = expert_parallel_moe(ops, x, ids, weights, w13, w2, 2)
    assert out.shape == (0, 8)


# ---------------------------------------------------------------- the torch_npu provider


def test_npu_moe_module_imports_without_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # any ``import torch_npu`` now raises ImportError
    for name in ("ascend_kernel.ops.moe_npu", "ascend_kernel.ops.npu"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # a fresh import; the originals come back after
    npu = importlib.import_module("ascend_kernel.ops.npu")
    with pytest.raises(ImportError):
        npu.TorchNpuOps()


def test_npu_provider_offers_every_moe_op_with_the_same_parameters():
    from ascend_kernel.ops.moe_npu import TorchNpuMoEOps
    from ascend_kernel.ops.npu import TorchNpuOps
    from ascend_kernel.ops.reference import ReferenceOps

    for name in MOE_OPS:
        assert callable(getattr(ReferenceOps, name)) and name in vars(TorchNpuMoEOps)
        assert getattr(TorchNpuOps, name) is vars(TorchNpuMoEOps)[name]
        ref, npu = inspect.signature(getattr(ReferenceOps, name)), inspect.signature(getattr(TorchNpuOps, name))
        assert list(npu.parameters) == list(ref.parameters)


class DocumentedNpu:
    """Stands in for torch_npu: each kernel as its documentation states it, including what it refuses."""

    @staticmethod
    def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
        assert finished is None and x.shape[0] > 0
        y, idx = torch.softmax(x, -1).topk(k, -1)
        return y, idx.to(torch.int32), None

    @staticmethod
    def npu_moe_init_routing_v2(x, expert_idx, *, scale, offset, active_num, expert_capacity, expert_num,
                                drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode,
                                active_expert_range, row_idx_type):
        assert (drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode, row_idx_type) == \
            (0, 1, True, -1, 0)
        assert expert_idx.dtype == torch.int32 and scale is None and offset is None
        start, end = active_expert_range
        assert 0 <= start < end <= expert_num and x.shape[0] > 0
        flat = expert_idx.reshape(-1).long()
        key = torch.where(flat < start, torch.full_like(flat, 2**31 - 1), flat)  # the documented sort key
        order = torch.argsort(key, stable=True)
        valid = int(((flat >= start) & (flat < end)).sum())
        row_idx = torch.full_like(flat, -1)
        row_idx[order[:valid]] = torch.arange(valid)
        rows = min(active_num, flat.numel())
        expanded_x = torch.full((rows, x.shape[1]), float("nan"), dtype=x.dtype)  # past the valid rows: undefined
        expanded_x[:valid] = x[order[:valid] // expert_idx.shape[1]]
        counts = torch.bincount(flat[order[:valid]] - start, minlength=end - start)
        return expanded_x, row_idx.to(torch.int32), counts, None

    @staticmethod
    def npu_grouped_matmul(x, weight, *, split_item, group_type, group_list_type, group_list):
        assert (split_item, group_type, group_list_type) == (2, 0, 0) and len(x) == len(weight) == 1
        (rows,), (w,) = x, weight
        ends = group_list.tolist()
        assert w.dim() == 3 and len(ends) == w.shape[0] and ends[-1] == rows.shape[0] and ends == sorted(ends)
        out = rows.new_empty(rows.shape[0], w.shape[-1])
        for g, (a, b) in enumerate(zip([0, *ends[:-1]], ends)):
            out[a:b] = rows[a:b] @ w[g]
        return [out]

    @staticmethod
    def npu_swiglu(x, dim=-1):
        assert x.numel() > 0 and x.is_contiguous()
        a, b = x.chunk(2, dim)
        return F.silu(a) * b

    @staticmethod
    def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
        tokens, k = probs.shape
        assert not padded_mode and restore_shape is None and sorted_indices.dtype == torch.int32
        assert permuted_tokens.shape[0] == tokens * k
        assert sorted(sorted_indices.tolist()) == list(range(tokens * k))  # in range, no repeats
        gathered = permuted_tokens[sorted_indices.long()].view(tokens, k, -1)
        return (gathered * probs.unsqueeze(-1).to(gathered.dtype)).sum(1)


def documented_npu():
    """The torch_npu provider's MoE ops over :class:`DocumentedNpu`."""
    from ascend_kernel.ops.moe_npu import TorchNpuMoEOps

    provider = TorchNpuMoEOps()
    provider._npu = DocumentedNpu()
    return provider


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 7), st.integers(1, 6), st.data(), st.integers(0, 2**16))
def test_npu_adaptations_match_the_reference_on_the_documented_kernels(tokens, experts, data, seed):
    npu = documented_npu()
    k = data.draw(st.integers(1, experts))
    split = data.draw(st.integers(0, experts))
    x, ids, weights, w13, w2 = moe_inputs(tokens, experts, k, seed)
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed))
    for got, want in zip(npu.moe_gating_top_k_softmax(logits, k), ops.moe_gating_top_k_softmax(logits, k)):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want)
    for start, end in ((0, split), (split, experts)):
        for got, want in zip(npu.moe_init_routing(x, ids, experts, (start, end)),
                             ops.moe_init_routing(x, ids, experts, (start, end))):
            assert got.dtype == want.dtype and torch.equal(got, want)
    out = expert_parallel_moe(npu, x, ids, weights, w13, w2, split)
    torch.testing.assert_close(out, expert_parallel_moe(ops, x, ids, weights, w13, w2, split), rtol=1e-5, atol=1e-6)


def test_npu_grouped_matmul_zeroes_rows_past_the_groups():
    npu = documented_npu()
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(9, 4, generator=gen), torch.randn(3, 4, 5, generator=gen)
    for counts in ([2, 0, 3], [0, 0, 0], [4, 2, 3]):
        counts = torch.tensor(counts)
        torch.testing.assert_close(npu.grouped_matmul(x, weight, counts), ops.grouped_matmul(x, weight, counts))
    one = torch.tensor([5])  # a single group goes as a running sum: counts of length 1 are refused by the kernel
    torch.testing.assert_close(npu.grouped_matmul(x, weight[:1], one), ops.grouped_matmul(x, weight[:1], one))

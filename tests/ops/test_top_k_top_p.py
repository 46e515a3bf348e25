"""The top-k/top-p filter of the ops seam: exactly vLLM's filter, and the torch_npu provider's routing.

The oracle is vLLM's own PyTorch filter (``apply_top_k_top_p_pytorch``, both
its sort path and, for top-k alone, its sort-free path). The kept set must be
identical, including on tie-heavy logits (bfloat16-rounded, repeated values)
and with k and p absent, active or inactive per row.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops
from tests.sampling.cases import make_case, vllm_filter

ops = get_ops("reference", "cpu")
NEG_INF = float("-inf")


MODES = st.sampled_from(["none", "all", "mixed"])


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 6), st.integers(2, 400), st.sampled_from(["random", "bf16", "repeated"]),
       MODES, MODES, st.sampled_from([torch.float32, torch.float64]))
def test_reference_keeps_exactly_what_vllm_keeps(seed, rows, vocab, kind, k_mode, p_mode, dtype):
    logits, k, p = make_case(seed, rows, vocab, kind, k_mode, p_mode, dtype)
    ours = ops.top_k_top_p(logits.clone(), k, p)
    if k is None and p is None:
        assert ours is logits or torch.equal(ours, logits)
        return
    theirs = vllm_filter(logits, k, p)
    assert torch.equal(ours.isfinite(), theirs.isfinite())
    kept = ours.isfinite()
    assert torch.equal(ours[kept], logits[kept])  # kept tokens keep their logit
    if logits.isfinite().all():
        assert kept.any(dim=-1).all()  # the best token always survives
    if p is None:  # vLLM's sort path (no CPU sync) agrees too
        assert torch.equal(ours.isfinite(), vllm_filter(logits, k, p, allow_cpu_sync=False).isfinite())


def test_ties_at_the_kth_value_are_kept():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.5]])
    out = ops.top_k_top_p(logits, torch.tensor([2]), None)
    assert out.isfinite().tolist() == [[True, True, True, True, False, False]]
    out = ops.top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert out.isfinite().tolist() == [[True, True, True, True, False, False]]
    assert torch.equal(vllm_filter(logits, torch.tensor([2]), None).isfinite(), out.isfinite())


def test_best_token_always_kept_and_no_filter_values():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0], [0.0, 5.0, 1.0, 4.0]])
    out = ops.top_k_top_p(logits, None, torch.tensor([1e-9, 0.0]))
    assert out.isfinite().tolist() == [[False, True, False, False]] * 2
    # k >= vocab (or k <= 0) and p == 1: nothing is filtered
    for k in (4, 7, 0):
        out = ops.top_k_top_p(logits, torch.tensor([k, k]), torch.tensor([1.0, 1.0]))
        assert out.isfinite().all()
    # ...except, as in vLLM, p == 1 drops tokens whose float32 probability is exactly 0
    far = torch.tensor([[0.0, 200.0, 199.0, 198.0]])
    assert ops.top_k_top_p(far, None, torch.tensor([1.0])).isfinite().tolist() == [[False, True, True, True]]
    assert torch.equal(vllm_filter(far, None, torch.tensor([1.0])).isfinite(),
                       ops.top_k_top_p(far, None, torch.tensor([1.0])).isfinite())
    assert ops.top_k_top_p(far, torch.tensor([4]), None).isfinite().all()


def test_top_p_boundary_drops_mass_at_most_one_minus_p():
    # uniform over 4 tokens: ascending masses 0.25, 0.5, 0.75, 1; p = 0.5 drops the two with mass <= 0.5
    logits = torch.zeros(1, 4)
    out = ops.top_k_top_p(logits, None, torch.tensor([0.5]))
    assert int(out.isfinite().sum()) == 2
    assert torch.equal(out.isfinite(), vllm_filter(logits, None, torch.tensor([0.5])).isfinite())
    out = ops.top_k_top_p(logits, None, torch.tensor([0.51]))
    assert int(out.isfinite().sum()) == 3


def test_large_vocabulary_matches_vllm():
    for kind in ("random", "bf16"):
        logits, k, p = make_case(7, 4, 151936, kind, "mixed", "mixed")
        k[0] = 50
        p[1] = 0.9
        assert torch.equal(ops.top_k_top_p(logits.clone(), k, p).isfinite(), vllm_filter(logits, k, p).isfinite())


# -- the torch_npu provider, with a stand-in for torch_npu that computes the op's documented formula ----------


class FakeTorchNpu:
    """``npu_top_k_top_p`` as its documentation defines it (stable ascending sort), checking its input limits."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, torch.dtype, torch.dtype]] = []

    def npu_top_k_top_p(self, logits, p, k):
        assert k.dtype == torch.int32 and p.dtype == logits.dtype
        assert int(k.min()) >= 1 and int(k.max()) <= min(1024, logits.shape[-1])
        assert float(p.min()) >= 0 and float(p.max()) <= 1
        self.calls.append((logits.shape[0], p.dtype, k.dtype))
        vocab = logits.shape[-1]
        ordered, order = logits.sort(dim=-1, stable=True)
        kth = ordered.gather(1, (vocab - k.long()).unsqueeze(1))
        ordered = ordered.masked_fill(ordered < kth, NEG_INF)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - p.unsqueeze(1)
        drop[:, -1] = False
        return logits.scatter(-1, order, ordered.masked_fill(drop, NEG_INF))


def npu_ops():
    from ascend_kernel.ops.npu import TorchNpuOps

    provider = object.__new__(TorchNpuOps)  # no torch_npu here: the stand-in takes its place
    provider._npu = FakeTorchNpu()
    return provider


def test_npu_provider_serves_rows_within_the_ops_limits_and_falls_back_for_the_rest():
    provider = npu_ops()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3000, generator=gen) * 3
    k = torch.tensor([50, 2000, 3000, 1024, 0, 5], dtype=torch.int32)  # 2000: over the op's range; 3000/0: no top-k
    p = torch.tensor([0.9, 0.8, 0.7, 1.0, 0.95, 0.5])
    out = provider.top_k_top_p(logits, k, p)
    assert provider._npu.calls == [(3, torch.float32, torch.int32)]  # rows 0, 3, 5 went to the op
    assert torch.equal(out.isfinite(), vllm_filter(logits, k.clamp(min=1).masked_fill(k == 0, 3000), p).isfinite())


def test_npu_provider_top_k_alone_skips_the_op_and_small_vocab_without_top_k_uses_it():
    provider = npu_ops()
    logits = torch.randn(3, 500)
    out = provider.top_k_top_p(logits, torch.tensor([3, 500, 7], dtype=torch.int32), None)
    assert provider._npu.calls == []
    assert out.isfinite().sum(dim=-1).tolist() == [3, 500, 7]
    out = provider.top_k_top_p(logits, None, torch.tensor([0.9, 0.5, 1.0]))  # k absent, vocab <= 1024: k = vocab
    assert provider._npu.calls == [(3, torch.float32, torch.int32)]
    assert torch.equal(out.isfinite(), vllm_filter(logits, None, torch.tensor([0.9, 0.5, 1.0])).isfinite())
    big = torch.randn(2, 2048)
    provider.top_k_top_p(big, None, torch.tensor([0.9, 0.5]))  # no top-k over 1024 tokens: the reference
    assert len(provider._npu.calls) == 1


@pytest.mark.parametrize("kind", ["random", "bf16"])
def test_npu_op_formula_equals_reference_except_for_ties_across_the_top_p_boundary(kind):
    """The stand-in (stable sort) and the reference (torch.sort, as vLLM) differ only in which tied tokens survive."""
    provider = npu_ops()
    for seed in range(20):
        logits, k, p = make_case(seed, 4, 1000, kind, "all", "all")
        k = k.clamp(max=1000)
        ours = ops.top_k_top_p(logits, k, p).isfinite()
        op = provider.top_k_top_p(logits, k, p).isfinite()
        assert torch.equal(ours.sum(dim=-1), op.sum(dim=-1))
        if kind == "random":
            assert torch.equal(ours, op)
        else:  # a differing token has a tied twin on the other side
            for r, c in (ours != op).nonzero().tolist():
                twins = (logits[r] == logits[r, c]) & (ours[r] != ours[r, c])
                assert twins.any()


def test_sampler_plugin_samples_like_vllm_with_same_seeds():
    """Same filter, same noise: the seam sampler draws the very tokens vLLM's native path draws."""
    from ascend_kernel_plugins.sampling.plugin import SeamTopKTopPSampler
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    class Cfg:  # the two model_config fields the sampler reads
        class model_config:
            logprobs_mode = "raw_logprobs"
            use_fp64_gumbel = False

    sampler = SeamTopKTopPSampler(ops).build(Cfg)
    native = TopKTopPSampler("raw_logprobs")
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1))
    k = torch.tensor([5, 50, 200, 1])
    p = torch.tensor([0.9, 0.5, 0.99, 0.3])
    draws = []
    for s in (sampler.topk_topp_sampler, native):
        gens = {i: torch.Generator().manual_seed(100 + i) for i in range(4)}
        fwd = s.forward if s is sampler.topk_topp_sampler else s.forward_native
        draws.append(fwd(logits.clone(), gens, k, p)[0])
    assert torch.equal(draws[0], draws[1])
    assert draws[0][3] == logits[3].argmax()  # k=1 is greedy

"""The top-k/top-p filter of the ops seam vs vLLM's own PyTorch filter (the oracle)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops

ops = get_ops("reference", "cpu")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(2, 300), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_filter_matches_vllm(rows, vocab, use_k, use_p, seed):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3
    k = torch.randint(1, vocab + 1, (rows,), generator=gen) if use_k else None
    p = torch.rand(rows, generator=gen, dtype=torch.float64) * 0.98 + 0.01 if use_p else None
    ours = ops.top_k_top_p(logits.clone(), k, p)
    theirs = apply_top_k_top_p_pytorch(logits.clone(), k, p)
    kept, kept_ref = ours.isfinite(), theirs.isfinite()
    if p is not None and not torch.equal(kept, kept_ref):
        # only a token sitting exactly on the nucleus boundary may differ (summation order)
        assert int((kept != kept_ref).sum()) <= rows
    else:
        assert torch.equal(kept, kept_ref)
    torch.testing.assert_close(ours[kept & kept_ref], logits[kept & kept_ref])
    assert kept.any(dim=-1).all()  # the best token always survives


def test_sampler_plugin_samples_like_vllm_with_same_seeds():
    """Same filter, same noise: the seam sampler draws the very tokens vLLM's native path draws."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from ascend_kernel_plugins.sampling.plugin import SeamTopKTopPSampler

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

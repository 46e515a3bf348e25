"""The ``fast-cpu`` sampler: vLLM's kept set without a full sort, vLLM-CPU's draws, the softmax distribution."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ascend_kernel_plugins.sampling import topk_topp
from ascend_kernel_plugins.sampling.fast_cpu import FastCpuSampler, fast_topk_topp_class
from ascend_kernel_plugins.sampling.topk_topp import (
    filter_top_k_top_p,
    gumbel_argmax_candidates,
    kept_sets,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .cases import chi_square_pvalue, make_case, metadata, vllm_filter

MODES = st.sampled_from(["none", "all", "mixed"])


def vllm_topk_topp(mode: str = "raw_logprobs"):
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler(mode)
    assert sampler.forward.__name__ == "forward_cpu"  # vLLM-CPU's fused Gumbel-max path is the oracle
    return sampler


# -- the kept set ---------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 7), st.integers(2, 700), st.sampled_from(["random", "bf16", "repeated"]),
       MODES, MODES, st.sampled_from([torch.float32, torch.float64]))
def test_kept_set_equals_vllms_filter(seed, rows, vocab, kind, k_mode, p_mode, dtype):
    logits, k, p = make_case(seed, rows, vocab, kind, k_mode, p_mode, dtype)
    if k is not None and seed % 3 == 0:
        k = k.clamp(max=40)  # short top-k windows, as in serving
    ours = filter_top_k_top_p(logits, k, p)
    theirs = vllm_filter(logits, k, p) if (k is not None or p is not None) else logits
    assert torch.equal(ours.isfinite(), theirs.isfinite())
    assert torch.equal(ours[ours.isfinite()], logits[ours.isfinite()])


@pytest.mark.parametrize("kind", ["random", "bf16"])
@pytest.mark.parametrize("scale", [3.0, 5.0, 8.0])
def test_kept_set_equals_vllms_filter_at_vocabulary_151936(kind, scale):
    gen = torch.Generator().manual_seed(int(scale))
    logits = torch.randn(12, 151936, generator=gen) * scale
    if kind == "bf16":
        logits = logits.bfloat16().float()
    k = torch.tensor([50, 50, 151936, 151936, 20, 1, 151936, 1000, 50, 151936, 3, 151936], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 0.9, 1.0, 0.5, 0.9, 0.95, 0.8, 0.999, 0.3, 1.0, 0.7])
    for kk, pp in ((k, p), (k, None), (None, p)):
        assert torch.equal(filter_top_k_top_p(logits, kk, pp).isfinite(), vllm_filter(logits, kk, pp).isfinite())


def count_index_sorts(monkeypatch) -> list[int]:
    """Rows that take their token order from torch.sort (vLLM's full index sort), recorded per call."""
    rows: list[int] = []
    real = topk_topp._drop_in_sort_order
    monkeypatch.setattr(topk_topp, "_drop_in_sort_order",
                        lambda out, x, sub, *rest: rows.append(sub.numel()) or real(out, x, sub, *rest))
    return rows


def test_continuous_logits_never_need_the_index_sort(monkeypatch):
    """float32 logits have no ties at the boundary: no row should pay for vLLM's full index sort."""
    sorted_rows = count_index_sorts(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 151936, generator=gen) * 5
    for k, p in ((torch.full((32,), 50), torch.full((32,), 0.9)), (None, torch.full((32,), 0.9)),
                 (torch.full((32,), 40), None)):
        sets = kept_sets(logits, k, p)
        if k is not None:
            assert sets.cand_rows.numel() == 32  # short candidate lists, not whole rows
        assert torch.equal(sets.materialize(logits).isfinite(), vllm_filter(logits, k, p).isfinite())
    assert sorted_rows == []


def test_a_run_of_equal_values_split_by_the_boundary_takes_vllms_sort_order(monkeypatch):
    """Which of the tied tokens survive is torch.sort's choice: those rows use it, and agree with vLLM."""
    sorted_rows = count_index_sorts(monkeypatch)
    logits = torch.full((2, 1000), -20.0)
    logits[:, 100:108] = 5.0  # eight tied leaders holding nearly all the mass: p = 0.45 splits the run
    p = torch.tensor([0.45, 0.45])
    for k in (torch.tensor([20, 20]), None):
        sorted_rows.clear()
        ours = filter_top_k_top_p(logits, k, p)
        assert sorted_rows == [2]
        kept = ours.isfinite()
        assert kept.sum(dim=-1).tolist() == [4, 4]  # half the run survives, as in vLLM's sorted row
        assert torch.equal(kept, vllm_filter(logits, k, p).isfinite())


# -- the noise and the draws ----------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [7, 1000, 151936])
def test_candidate_noise_is_the_fused_kernels_noise(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=gen) * 3
    logits[:, ::5] = float("-inf")
    seeds = torch.randint(0, 2**31, (64,), generator=gen)
    ids = torch.arange(vocab).expand(64, vocab)
    assert torch.equal(gumbel_argmax_candidates(ids, logits, seeds, vocab), torch.ops._C.fused_gumbel_argmax(logits, seeds))
    # a subset of candidates holding the winner gives the same token
    winner = torch.ops._C.fused_gumbel_argmax(logits, seeds)
    sub = torch.stack([torch.tensor([int(w), (int(w) + 1) % vocab]) for w in winner])
    assert torch.equal(gumbel_argmax_candidates(sub, logits.gather(1, sub), seeds, vocab), winner)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logits", "processed_logprobs"])
def test_draws_vllm_cpus_tokens_with_global_and_per_request_generators(mode):
    fast, native = fast_topk_topp_class()(mode), vllm_topk_topp(mode)
    assert fast.fast
    gen = torch.Generator().manual_seed(5)
    for trial in range(24):
        vocab = (50, 3000, 151936)[trial % 3]
        logits = torch.randn(9, vocab, generator=gen) * (2 + trial % 5)
        if trial % 2:
            logits = logits.bfloat16().float()
        k = torch.randint(1, min(vocab, 80) + 1, (9,), generator=gen, dtype=torch.int32)
        k[0] = vocab
        p = torch.rand(9, generator=gen) * 0.9 + 0.05
        p[1] = 1.0
        k, p = (k, p) if trial % 4 == 0 else (k, None) if trial % 4 == 1 else (None, p) if trial % 4 == 2 else (k, p)
        results = []
        for sampler in (fast, native):
            torch.manual_seed(trial)
            gens = {2: torch.Generator().manual_seed(22), 5: torch.Generator().manual_seed(55)}
            tokens, processed = sampler.forward(logits.clone(), gens, k, p)
            results.append((tokens, processed, gens[2].get_state(), torch.randint(0, 2**31, (1,))))
        (t1, p1, g1, r1), (t2, p2, g2, r2) = results
        assert torch.equal(t1, t2)
        assert torch.equal(g1, g2) and torch.equal(r1, r2)  # generators consumed exactly as vLLM consumes them
        if mode == "raw_logprobs":
            assert p1 is None and p2 is None
        else:
            assert torch.equal(p1.isfinite(), p2.isfinite())
            torch.testing.assert_close(p1[p1.isfinite()], p2[p2.isfinite()])


@pytest.mark.parametrize("k,p", [(5, None), (None, 0.8), (6, 0.7), (12, 1.0)])
def test_draws_follow_the_softmax_of_the_filtered_logits(k, p):
    draws, vocab = 100_000, 12
    gen = torch.Generator().manual_seed(3)
    row = torch.randn(vocab, generator=gen) * 1.5
    row[3] = row[7]  # a tie
    logits = row.expand(draws, vocab).contiguous()
    kk = torch.full((draws,), k, dtype=torch.int32) if k is not None else None
    pp = torch.full((draws,), p) if p is not None else None
    sampler = fast_topk_topp_class()("raw_logprobs")
    torch.manual_seed(0)
    tokens, _ = sampler.forward(logits, {}, kk, pp)
    target = vllm_filter(row.unsqueeze(0), kk[:1] if kk is not None else None,
                         pp[:1] if pp is not None else None).softmax(dim=-1)[0].double()
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert chi_square_pvalue(counts, target) > 1e-4
    assert 0.5 * (counts / draws - target).abs().sum() < 0.01  # total variation


# -- the module the runner calls --------------------------------------------------------------------------------


def test_sampler_module_equals_vllms_sampler_with_greedy_rows_untouched():
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.sampler import Sampler

    config = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode="raw_logprobs", use_fp64_gumbel=False))
    ours, theirs = FastCpuSampler().build(config), Sampler()
    assert isinstance(ours, Sampler) and type(ours.topk_topp_sampler).__name__ == "FastTopKTopPSampler"
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(8, 5000, generator=gen) * 4
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.3, 0.9, 0.0, 1.0])
    top_k = torch.tensor([5000, 40, 5000, 5000, 10, 5000, 5000, 3], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.8, 1.0, 1.0, 0.5, 1.0, 0.95])
    outs = []
    for sampler in (ours, theirs):
        torch.manual_seed(4)
        gens = {1: torch.Generator().manual_seed(1), 4: torch.Generator().manual_seed(4)}
        out = sampler(logits=logits.clone(), sampling_metadata=metadata(8, temperature, top_k, top_p, gens))
        assert isinstance(out, SamplerOutput) and out.sampled_token_ids.shape == (8, 1)
        outs.append(out.sampled_token_ids)
    assert torch.equal(outs[0], outs[1])
    greedy = temperature == 0
    assert torch.equal(outs[0][greedy, 0].long(), logits[greedy].argmax(dim=-1))


def test_plugin_choice_on_cpu_and_elsewhere():
    from ascend_kernel_plugins.sampling.plugin import ascend_kernel_samplers

    from ascend_kernel.device import DeviceInfo
    from ascend_kernel.registry import choose
    from ascend_kernel.settings import load_settings

    entries = ascend_kernel_samplers()
    for kind, expected in (("cpu", "fast-cpu"), ("npu", "vllm-default")):
        ctx = SimpleNamespace(vllm_config=None, settings=load_settings(), device=DeviceInfo(kind=kind, soc=None))
        chosen, record = choose("sampler", entries, ctx, forced=None, forcing_setting="ASCEND_KERNEL_SAMPLER")
        assert chosen.name == expected
    reasons = {c.name: c.reason for c in record.candidates}
    assert "device is npu" in reasons["fast-cpu"]
    ctx = SimpleNamespace(vllm_config=None, settings=load_settings({"ascend_kernel": {"enable_topk_topp_optimization": True}}),
                          device=DeviceInfo(kind="cpu", soc=None))
    assert choose("sampler", entries, ctx, forced=None, forcing_setting="X")[0].name == "ascend-topk-topp"

"""Test cases shared by the sampling tests: logits (continuous, bf16-rounded, repeated) and per-row k/p."""

from __future__ import annotations

import torch


def vllm_filter(logits, k, p, allow_cpu_sync=True):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    return apply_top_k_top_p_pytorch(logits.clone(), k.clone() if k is not None else None, p, allow_cpu_sync)


def make_case(seed: int, rows: int, vocab: int, kind: str, k_mode: str, p_mode: str, dtype=torch.float32):
    """Logits (continuous, bf16-rounded or few repeated values) and per-row k/p mixing active and inactive rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * (1 + seed % 5)
    if kind == "bf16":
        logits = logits.to(torch.bfloat16).to(torch.float64)
    elif kind == "repeated":
        logits = torch.randint(0, 6, (rows, vocab), generator=gen).to(torch.float64) / 2
    logits = logits.to(dtype)
    k = p = None
    if k_mode != "none":
        k = torch.randint(1, vocab + 1, (rows,), generator=gen, dtype=torch.int32)
        if k_mode == "mixed":  # some rows without a top-k (vLLM passes the vocabulary size)
            k[torch.rand(rows, generator=gen) < 0.4] = vocab
    if p_mode != "none":
        p = (torch.rand(rows, generator=gen) * 0.98 + 0.01).to(torch.float32)
        if p_mode == "mixed":  # some rows without a top-p (vLLM passes 1.0)
            p[torch.rand(rows, generator=gen) < 0.4] = 1.0
    return logits, k, p


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness of fit; the p-value from the regularised upper incomplete gamma function."""
    n = counts.sum()
    expected = probs * n
    assert (counts[probs == 0] == 0).all()  # never a token outside the kept set
    live = probs > 0
    stat = ((counts[live] - expected[live]) ** 2 / expected[live]).sum()
    dof = int(live.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def metadata(batch, temperature, top_k=None, top_p=None, generators=None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    greedy = temperature == 0
    return SamplingMetadata(
        temperature=None if bool(greedy.all()) else temperature, all_greedy=bool(greedy.all()),
        all_random=bool((~greedy).all()), top_p=top_p, top_k=top_k, generators=generators or {},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())

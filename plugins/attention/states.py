"""The per-step attention state: which kind of batch the attention kernels see.

Ascend's fused attention kernels take different inputs (mask, cache use) for
a pure prefill, a decode-only batch, a chunked/mixed batch and a speculative
verification batch, so the runner decides the state once per step and
publishes it. The rules are the Ascend runner's, in the same order.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from ascend_kernel.step import StepBatch

#: speculative methods whose one-token decodes still run as SpecDecoding
MTP_METHODS = frozenset({"mtp", "deepseek_mtp"})
#: drafters whose verification batches run through the chunked-prefill kernel
EAGLE_METHODS = frozenset({"eagle", "eagle3"})


class AttentionState(enum.Enum):
    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4

    @property
    def is_prefill(self) -> bool:
        """True when the batch carries prompt tokens (MoE comm avoids MC2-only paths then)."""
        return self in (AttentionState.PrefillNoCache, AttentionState.PrefillCacheHit,
                        AttentionState.ChunkedPrefill)


class StandardStatePolicy:
    """The Ascend rules, with the config facts they need read once at build time."""

    __slots__ = ("spec_method", "chunked_prefill")

    def __init__(self, spec_method: str | None, chunked_prefill: bool) -> None:
        self.spec_method = spec_method
        self.chunked_prefill = chunked_prefill

    @classmethod
    def from_context(cls, ctx: Any) -> "StandardStatePolicy":
        spec = ctx.vllm_config.speculative_config
        return cls(
            spec_method=spec.method if spec is not None else None,
            chunked_prefill=bool(ctx.vllm_config.scheduler_config.enable_chunked_prefill),
        )

    def decide(self, batch: StepBatch) -> AttentionState:
        n = batch.num_reqs
        scheduled = batch.num_scheduled_tokens[:n]
        if np.array_equal(batch.seq_lens[:n], scheduled):
            return AttentionState.PrefillNoCache
        if np.all(scheduled == 1):
            # MTP verifies with the SpecDecoding kernel even for one-token steps
            # (PD disaggregation hands decodes over with no draft yet).
            if self.spec_method in MTP_METHODS:
                return AttentionState.SpecDecoding
            return AttentionState.DecodeOnly
        if np.all(batch.num_valid_tokens[:n] == 1):
            if self.spec_method in EAGLE_METHODS:
                return AttentionState.ChunkedPrefill
            return AttentionState.SpecDecoding
        # Mixed prefill/decode: split-fuse when the scheduler chunks prefills,
        # else a prefill over a partly cached prefix.
        if self.chunked_prefill:
            return AttentionState.ChunkedPrefill
        return AttentionState.PrefillCacheHit

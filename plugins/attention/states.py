"""The per-step attention state: which kind of batch the attention kernels see.

Ascend's fused attention kernels take different inputs (mask, cache use) for
a pure prefill, a decode-only batch, a chunked/mixed batch and a speculative
verification batch, so the runner decides the state once per step and
publishes it. The rules are the Ascend runner's, in the same order.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.step import AttentionState, StepBatch

#: the state enum is the core's contract type (:mod:`ascend_kernel.step`), named here for the family's users
__all__ = ["AttentionState", "StandardStatePolicy"]


class StandardStatePolicy:
    """The Ascend rules, with the config facts they need read once at build time.

    Two answers belong to the drafter, not to attention: the state of a batch
    whose every request verifies drafts (``verify_state``: SpecDecoding, or
    ChunkedPrefill for EAGLE, whose verification runs the split-fuse kernel)
    and of a batch of one-token decodes (``single_token_state``: DecodeOnly, or
    SpecDecoding for MTP, which hands decodes over with no draft yet under PD
    disaggregation). The chosen drafter declares them (``ctx.chosen["drafter"]``);
    without one they are SpecDecoding and DecodeOnly.
    """

    __slots__ = ("single_token_state", "verify_state", "chunked_prefill")

    def __init__(self, chunked_prefill: bool, single_token_state: AttentionState = AttentionState.DecodeOnly,
                 verify_state: AttentionState = AttentionState.SpecDecoding) -> None:
        self.single_token_state = single_token_state
        self.verify_state = verify_state
        self.chunked_prefill = chunked_prefill

    @classmethod
    def from_context(cls, ctx: Any) -> "StandardStatePolicy":
        drafter = getattr(ctx, "chosen", {}).get("drafter")
        return cls(
            chunked_prefill=bool(ctx.vllm_config.scheduler_config.enable_chunked_prefill),
            single_token_state=AttentionState[getattr(drafter, "single_token_state", "DecodeOnly")],
            verify_state=AttentionState[getattr(drafter, "verify_state", "SpecDecoding")],
        )

    def decide(self, batch: StepBatch) -> AttentionState:
        return self.decide_facts(batch.fresh, batch.single_token, batch.single_valid)

    def decide_facts(self, fresh: bool, single_token: bool, single_valid: bool) -> AttentionState:
        """The state from the batch's three facts alone (see StepBatch), so the runner tabulates it at start-up."""
        if fresh:  # seq_lens == scheduled for every request
            return AttentionState.PrefillNoCache
        if single_token:  # every request schedules one token
            return self.single_token_state
        if single_valid:  # every request has one valid (non-draft) token
            return self.verify_state
        # Mixed prefill/decode: split-fuse when the scheduler chunks prefills,
        # else a prefill over a partly cached prefix.
        if self.chunked_prefill:
            return AttentionState.ChunkedPrefill
        return AttentionState.PrefillCacheHit

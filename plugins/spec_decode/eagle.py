"""EAGLE / EAGLE-3: a draft head over the target's hidden states.

The head's layers get KV caches like the target's; EAGLE's verification
batches run through the split-fuse kernel (ChunkedPrefill), as the Ascend
runner does. The proposer is vLLM's ``EagleProposer``.
"""

from __future__ import annotations

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import HiddenStateDrafter


class EagleDrafter(HiddenStateDrafter):
    methods = frozenset({"eagle", "eagle3"})
    verify_state = "ChunkedPrefill"
    kv_cache = "the draft head's attention layers (kernel layouts, separate KV groups)"


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [Implementation(family="drafter", name="eagle", factory=lambda ctx: EagleDrafter(),
                           supports=EagleDrafter.supports, priority=10, aliases=("eagle3",),
                           description="EAGLE / EAGLE-3 draft head over the target's hidden states")]

"""The draft-model drafter: a separate small model on the target's vocabulary proposes the next tokens.

The draft model runs through the same attention backend as the target (its
layers get KV caches from the kernel's layouts, in KV-cache groups of their
own); its forward passes build attention metadata with the backend's
``build_for_drafting``. Verification batches run the SpecDecoding kernel.
The proposer is vLLM's ``DraftModelProposer``.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import KernelDrafter


class DraftModelDrafter(KernelDrafter):
    methods = frozenset({"draft_model"})
    kv_cache = "the draft model's own attention layers (kernel layouts, separate KV groups)"

    def build(self, runner: Any) -> Any:
        from vllm.v1.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(vllm_config=runner.vllm_config, device=runner.device, runner=runner)


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [Implementation(family="drafter", name="draft-model", factory=lambda ctx: DraftModelDrafter(),
                           supports=DraftModelDrafter.supports, priority=10,
                           description="a separate small model on the same vocabulary")]

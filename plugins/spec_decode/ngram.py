"""The n-gram drafter: proposes continuations found earlier in the same sequence.

It needs no model, no KV cache and no device kernels, so it runs the same on
every host; vLLM's ``NgramProposer`` (numba, CPU) does the matching.
Verification batches run the SpecDecoding kernel.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import KernelDrafter


class NgramDrafter(KernelDrafter):
    methods = frozenset({"ngram"})

    def build(self, runner: Any) -> Any:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(runner.vllm_config)


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [Implementation(family="drafter", name="ngram", factory=lambda ctx: NgramDrafter(),
                           supports=NgramDrafter.supports, priority=10,
                           description="prompt-lookup n-gram drafting (CPU, model-free)")]

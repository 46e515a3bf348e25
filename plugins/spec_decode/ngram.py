"""The n-gram drafter: proposes continuations found earlier in the same sequence.

It needs no model and no device kernels, so it runs the same on every host;
vLLM's ``NgramProposer`` (numba, CPU) does the matching.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation


class NgramDrafter:
    __slots__ = ()

    def build(self, runner: Any) -> Any:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(runner.vllm_config)


def _supports(ctx: Any) -> str | None:
    spec = ctx.vllm_config.speculative_config
    if spec is None:
        return "no speculative decoding configured"
    if spec.method != "ngram":
        return f"speculative method is {spec.method!r}, not 'ngram'"
    return None


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [
        Implementation(
            family="drafter",
            name="ngram",
            factory=lambda ctx: NgramDrafter(),
            supports=_supports,
            priority=10,
            description="prompt-lookup n-gram drafting (CPU, model-free)",
        )
    ]

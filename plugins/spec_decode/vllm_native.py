"""Fallback drafter: keep the proposer vLLM's own runner built for the method.

Methods without a dedicated plugin (EAGLE/EAGLE3, MTP, draft models, suffix,
...) keep running on the kernel platform through vLLM's proposer; a dedicated
plugin with a higher priority takes over a method as soon as it is installed,
and the decision record says which one served.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation


class VllmNativeDrafter:
    __slots__ = ()

    def build(self, runner: Any) -> Any:
        return runner.drafter


def _supports(ctx: Any) -> str | None:
    if ctx.vllm_config.speculative_config is None:
        return "no speculative decoding configured"
    return None


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [
        Implementation(
            family="drafter",
            name="vllm-native",
            factory=lambda ctx: VllmNativeDrafter(),
            supports=_supports,
            priority=-100,
            description="the proposer vLLM's runner builds for the configured method",
        )
    ]

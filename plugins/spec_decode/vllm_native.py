"""Fallback drafter: keep the proposer vLLM's own runner built for the method.

Methods no plugin serves (suffix, medusa, ...) keep running on the kernel
platform through the proposer vLLM's runner built, with the default attention
states (SpecDecoding verification, DecodeOnly one-token decodes); a dedicated
plugin with a higher priority takes over a method as soon as it is installed,
and the decision record says which one served.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import KernelDrafter


class VllmNativeDrafter(KernelDrafter):
    kv_cache = "whatever vLLM's proposer asks for"

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

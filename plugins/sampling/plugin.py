"""vLLM's sampler and rejection sampler, registered as the default sampling plugins."""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

ASCEND_KERNEL_ESSENTIAL = "every generating model needs a sampler"


class VllmSampler:
    __slots__ = ()

    def build(self, vllm_config: Any) -> Any:
        from vllm.v1.sample.sampler import Sampler

        model = vllm_config.model_config
        return Sampler(logprobs_mode=model.logprobs_mode, use_fp64_gumbel=model.use_fp64_gumbel)


class VllmRejectionSampler:
    __slots__ = ()

    def build(self, sampler: Any, vllm_config: Any, device: Any) -> Any:
        from vllm.v1.sample.rejection_sampler import RejectionSampler

        return RejectionSampler(sampler, vllm_config.speculative_config, device)


def _needs_speculation(ctx: Any) -> str | None:
    return None if ctx.vllm_config.speculative_config is not None else "no speculative decoding configured"


@hookimpl
def ascend_kernel_samplers() -> list[Implementation]:
    return [
        Implementation(
            family="sampler",
            name="vllm-default",
            factory=lambda ctx: VllmSampler(),
            description="vLLM's Sampler (temperature, top-k/top-p, penalties, logprobs)",
        )
    ]


@hookimpl
def ascend_kernel_rejection_samplers() -> list[Implementation]:
    return [
        Implementation(
            family="rejection_sampler",
            name="vllm-default",
            factory=lambda ctx: VllmRejectionSampler(),
            supports=_needs_speculation,
            description="vLLM's RejectionSampler over the chosen sampler",
        )
    ]

"""vLLM's sampler and rejection sampler, registered as the default sampling plugins."""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

ASCEND_KERNEL_ESSENTIAL = "every generating model needs a sampler"


class VllmSampler:
    __slots__ = ()

    def build(self, vllm_config: Any) -> Any:
        from vllm.v1.sample.sampler import Sampler

        model = vllm_config.model_config
        return Sampler(logprobs_mode=model.logprobs_mode, use_fp64_gumbel=model.use_fp64_gumbel)


class SeamTopKTopPSampler:
    """vLLM's Sampler whose top-k/top-p filter runs on the ops seam (npu_top_k_top_p on NPU)."""

    __slots__ = ("ops",)

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    @classmethod
    def from_context(cls, ctx: Any) -> "SeamTopKTopPSampler":
        from ascend_kernel.ops import get_ops

        return cls(get_ops(ctx.settings.ops_provider, ctx.device.kind))

    def build(self, vllm_config: Any) -> Any:
        from vllm.v1.sample.ops.topk_topp_sampler import random_sample

        ops = self.ops
        sampler = VllmSampler().build(vllm_config)
        inner = sampler.topk_topp_sampler

        def forward(logits, generators, k, p):
            logits = ops.top_k_top_p(logits, k, p)
            processed = None
            if inner.logprobs_mode == "processed_logits":
                processed = logits
            elif inner.logprobs_mode == "processed_logprobs":
                processed = logits.log_softmax(dim=-1, dtype=torch.float32)
            probs = logits.softmax(dim=-1, dtype=torch.float32)
            return random_sample(probs, generators, inner.use_fp64_gumbel), processed

        inner.forward = forward  # nn.Module.__call__ dispatches to the instance attribute
        return sampler


def _topk_topp_enabled(ctx: Any) -> str | None:
    if not ctx.settings.enable_topk_topp_optimization:
        return "ASCEND_KERNEL_ENABLE_TOPK_TOPP_OPTIMIZATION is off"
    return None


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
        ),
        Implementation(
            family="sampler",
            name="ascend-topk-topp",
            factory=SeamTopKTopPSampler.from_context,
            supports=_topk_topp_enabled,
            priority=10,
            description="vLLM's Sampler with the top-k/top-p filter on the ops seam (npu_top_k_top_p on NPU)",
        ),
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

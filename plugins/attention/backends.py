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

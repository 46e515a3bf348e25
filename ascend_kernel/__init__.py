"""ascend-kernel: vLLM on Ascend NPUs as a small runner core plus plugins.

``register`` is vLLM's platform-plugin entry point (group
``vllm.platform_plugins``). It returns a platform class path only when the
kernel should run: on a host with torch_npu and a visible NPU, or when
``ASCEND_KERNEL_DEVICE=cpu`` asks for the CPU fallback. Otherwise it returns
None, so installing the package never takes over a CUDA or plain CPU host.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logger = logging.getLogger("ascend_kernel")

CPU_PLATFORM = "ascend_kernel.platform.cpu.KernelCpuPlatform"
NPU_PLATFORM = "ascend_kernel.platform.npu.KernelNpuPlatform"


def register() -> str | None:
    """vLLM platform plugin: the platform class path, or None to stay out of the way."""
    from ascend_kernel.device import npu_available, resolve_device_kind
    from ascend_kernel.errors import SettingsError
    from ascend_kernel.settings import env_requests_kernel, load_settings

    try:
        settings = load_settings()
    except SettingsError as exc:
        # vLLM swallows exceptions raised here (it logs them at debug level and
        # falls back to another platform). Asked for the kernel but with a bad
        # value (an unknown or empty ASCEND_KERNEL_* variable included):
        # activate it anyway so that its config check raises this error where
        # the user sees it, instead of silently running without it. There it
        # passes through VllmConfig as itself: SettingsError is no ValueError,
        # which pydantic would rewrap as a validation error about VllmConfig.
        # On an NPU host the kernel is the platform whatever the variables say
        # (a refused VLLM_ASCEND_* one included): staying off there would run
        # vLLM without the kernel and hide the refusal.
        logger.error("%s", exc)
        return NPU_PLATFORM if npu_available() else (CPU_PLATFORM if env_requests_kernel() else None)
    kind = resolve_device_kind(settings)
    if kind == "npu":
        return NPU_PLATFORM
    if kind == "cpu":
        return CPU_PLATFORM
    return None

"""The NPU platform (needs torch_npu and a visible NPU; not run in CI).

Device facts follow torch_npu's conventions: device type ``npu``, dispatch key
``PrivateUse1``, HCCL collectives, ``ASCEND_RT_VISIBLE_DEVICES``. Everything
feature-shaped (backends, config fix-ups, graph mode) comes from the plugins.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from ascend_kernel.device import Device
from ascend_kernel.platform.common import KernelPlatformMixin


class KernelNpuPlatform(KernelPlatformMixin, Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"
    dist_backend: str = "hccl"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"
    kernel_worker_cls = "ascend_kernel.worker.npu_worker.KernelNPUWorker"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return f"npu:{device_id}"

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        Device("npu").set_device(device)

    @classmethod
    def get_current_memory_usage(cls, device: Any = None) -> float:
        free, total = Device("npu").mem_get_info()
        return float(total - free)

    @classmethod
    def graph_pool_handle(cls) -> Any:
        """vLLM's global graph pool (``get_global_graph_pool``) through the device seam."""
        return Device("npu").graph_pool_handle()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        cls.kernel_check_and_update_config(vllm_config, lambda cfg: None)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, attn_selector_config: Any,
                             num_heads: int | None = None) -> str:
        def no_default() -> str:
            raise RuntimeError("the NPU platform has no native attention backend; an attention plugin must choose")

        return cls.kernel_attn_backend_cls(selected_backend, attn_selector_config, num_heads, no_default)

"""The CPU-fallback platform: vLLM's CPU platform with the kernel in charge of features.

Selected only when ``ASCEND_KERNEL_DEVICE=cpu``. It lets the whole kernel
(plugins, runner seams, Ascend backends on the reference ops provider) run
inside real vLLM on a host without an NPU.
"""

from __future__ import annotations

from typing import Any

from vllm.platforms.cpu import CpuPlatform

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.config_changes import change
from ascend_kernel.platform.common import KernelPlatformMixin


class KernelCpuPlatform(KernelPlatformMixin, CpuPlatform):
    #: one Ray ``CPU`` per worker (vLLM-CPU leaves this empty, so vLLM refuses Ray); why ``CPU`` and what else
    #: vLLM's Ray executor needs on a CPU host: ascend_kernel/platform/ray_executor.py
    ray_device_key: str = "CPU"
    kernel_worker_cls = "ascend_kernel.worker.cpu_worker.KernelCPUWorker"
    replaced_worker_cls = ("auto", "vllm.v1.worker.cpu_worker.CPUWorker")

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        """vLLM-CPU's communicator plus the variable-size gather/scatter that DP + EP MoE needs."""
        return "ascend_kernel.ops.cpu_communicator.KernelCpuCommunicator"

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        cls.kernel_check_and_update_config(vllm_config, super().check_and_update_config)
        parallel = vllm_config.parallel_config
        if parallel.distributed_executor_backend == "ray":
            from ascend_kernel.platform.ray_executor import KernelCpuRayExecutor

            kernel_mod.record_changes(vllm_config, [change(
                vllm_config, "parallel_config.distributed_executor_backend", KernelCpuRayExecutor,
                "vLLM's own Ray executor cannot start CPU workers (ascend_kernel/platform/ray_executor.py says why); "
                "this subclass can")])

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: Any, attn_selector_config: Any,
                             num_heads: int | None = None) -> str:
        return cls.kernel_attn_backend_cls(
            selected_backend, attn_selector_config, num_heads,
            lambda: super(KernelCpuPlatform, cls).get_attn_backend_cls(
                selected_backend, attn_selector_config, num_heads),
        )

    @classmethod
    def get_mla_prefill_backend_cls(cls, mla_selector_config: Any) -> type:
        return cls.kernel_mla_prefill_backend_cls(
            mla_selector_config,
            lambda: super(KernelCpuPlatform, cls).get_mla_prefill_backend_cls(mla_selector_config),
        )

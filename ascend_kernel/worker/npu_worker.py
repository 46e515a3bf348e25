"""The NPU worker: vLLM's GPU worker driven through the device seam.

vLLM's ``Worker.init_device`` only knows CUDA; on an NPU the device is set,
the HCCL group initialised and the kernel runner built here. Not run in this
project's CI (no NPU); it follows vLLM 0.32's worker contract.
"""

from __future__ import annotations

import torch
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

from ascend_kernel.device import Device
from ascend_kernel.worker.dummy_batch import KernelDummyBatchMixin
from ascend_kernel.worker.report import KernelReportMixin
from ascend_kernel.worker.sleep import KernelSleepMixin


class KernelNPUWorker(KernelSleepMixin, KernelDummyBatchMixin, KernelReportMixin, Worker):
    def init_device(self) -> None:
        from vllm.platforms import current_platform

        from ascend_kernel.runner.npu import KernelNPUModelRunner

        self.device = torch.device(f"npu:{self.local_rank}")
        Device("npu").set_device(self.device)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)
        self.model_runner = KernelNPUModelRunner(self.vllm_config, self.device)

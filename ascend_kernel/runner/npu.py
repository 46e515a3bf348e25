"""The kernel runner on NPU: the same mixin over vLLM's GPUModelRunner.

vLLM's GPU runner drives any torch accelerator through ``torch.accelerator``
and the platform's device type; the NPU platform and the device seam supply
the rest. There is one kernel-runner code path for both devices: the mixin.
"""

from __future__ import annotations

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from ascend_kernel.runner.kernel_runner import KernelRunnerMixin


class KernelNPUModelRunner(KernelRunnerMixin, GPUModelRunner):
    """GPUModelRunner on an NPU, feature seams answered by the kernel's plugins."""

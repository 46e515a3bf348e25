"""The kernel runner on CPU: the mixin over vLLM's CPUModelRunner."""

from __future__ import annotations

from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from ascend_kernel.runner.kernel_runner import KernelRunnerMixin


class KernelCPUModelRunner(KernelRunnerMixin, CPUModelRunner):
    """CPUModelRunner whose feature seams are answered by the kernel's plugins."""

"""An idle data-parallel rank's forward pass, seen by the kernel.

With data parallelism and expert parallelism, every DP rank must join every
MoE collective of a step, even one with no requests: vLLM makes the idle rank
run a dummy batch (``execute_dummy_batch``). The kernel runner gives that pass
an outcome of its own, so it publishes a MoE comm method like any step (the
policy picks it from the dummy batch's token count) and the trace counts the
dummy batches and the methods they ran, apart from the scheduled steps.
"""

from __future__ import annotations


class KernelDummyBatchMixin:
    def execute_dummy_batch(self) -> None:
        self.model_runner.kernel_dummy_batch(super().execute_dummy_batch)  # type: ignore[misc,attr-defined]

"""The worker RPC every kernel worker answers (``llm.collective_rpc("ascend_kernel_report")``), and its start-up log."""

from __future__ import annotations

from typing import Any


class KernelReportMixin:
    """Adds ``ascend_kernel_report``: decision records, KV allocation, step trace of this worker.

    The engine's first worker (rank 0) also logs the kernel's start-up summary
    through vLLM's logger once the KV cache is allocated (every decision is
    made by then), so each engine says once that the kernel is active and what
    it chose (see :mod:`ascend_kernel.logs`).
    """

    def init_device(self) -> None:
        from ascend_kernel.logs import wire_into_vllm

        wire_into_vllm()
        super().init_device()  # type: ignore[misc]

    def initialize_from_config(self, *args: Any, **kwargs: Any) -> None:
        super().initialize_from_config(*args, **kwargs)  # type: ignore[misc]
        if getattr(self, "rank", 0) == 0:
            from ascend_kernel.logs import log_startup

            log_startup(self.ascend_kernel_report())

    def ascend_kernel_report(self) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        if runner is None or not hasattr(runner, "kernel_report"):
            raise RuntimeError("this worker has no kernel runner (was the engine started on the kernel platform?)")
        return runner.kernel_report()

"""The worker RPC every kernel worker answers (``llm.collective_rpc("ascend_kernel_report")``)."""

from __future__ import annotations

from typing import Any


class KernelReportMixin:
    """Adds ``ascend_kernel_report``: decision records, KV allocation, step trace of this worker."""

    def ascend_kernel_report(self) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        if runner is None or not hasattr(runner, "kernel_report"):
            raise RuntimeError("this worker has no kernel runner (was the engine started on the kernel platform?)")
        return runner.kernel_report()

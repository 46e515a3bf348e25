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
        """The runner's report, stamped with this worker's rank in its engine and its engine's data-parallel rank.

        With data parallelism every engine numbers its workers from 0, so the
        two together name a worker when the server merges all engines' reports.
        The DP rank is ``data_parallel_index``: for a dense model vLLM makes
        each DP engine an independent DP=1 engine (``data_parallel_rank`` 0)
        and keeps the original rank there only.
        """
        runner = getattr(self, "model_runner", None)
        if runner is None or not hasattr(runner, "kernel_report"):
            raise RuntimeError("this worker has no kernel runner (was the engine started on the kernel platform?)")
        report = runner.kernel_report()
        report["kv_transfer"] = kv_transfer_report()
        report["rank"] = getattr(self, "rank", 0)
        report["dp_rank"] = self.vllm_config.parallel_config.data_parallel_index  # type: ignore[attr-defined]
        return report


def kv_transfer_report() -> dict[str, Any] | None:
    """What this worker's KV connector says it moved, or None without one.

    Connector-agnostic: a connector that offers ``describe_transfer()`` (the
    kernel's Mooncake subclass does: blocks and bytes sent and received)
    answers with it; any other connector is only named.
    """
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return None
    connector = get_kv_transfer_group()
    describe = getattr(connector, "describe_transfer", None)
    return describe() if describe is not None else {"connector": type(connector).__name__}

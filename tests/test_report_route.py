"""``GET /ascend-kernel/report``: 404 only when the engine's workers are not the kernel's; 500 naming any other failure.

The middleware is the real one, in front of a small Starlette app whose
state holds an engine client. The engine clients here answer
``collective_rpc`` the way vLLM's does: stock workers through vLLM's own
``run_method`` (its error for a method the worker lacks, wrapped as vLLM's
engine core wraps a failed utility call), a kernel worker that raises, one
that times out, and one that answers.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ascend_kernel.cli.serving import REPORT_PATH, KernelReportMiddleware


class StockWorker:
    """What vLLM's CPU worker offers for this question: nothing."""


class EngineClient:
    def __init__(self, worker: object) -> None:
        self.worker = worker

    async def collective_rpc(self, method: str, timeout: float | None = None, args=(), kwargs=None):
        from vllm.v1.serial_utils import run_method

        try:
            return [run_method(self.worker, method, args, kwargs or {})]
        except Exception as exc:  # vLLM's engine core: Exception(f"Call to {name} method failed: {e}")
            raise Exception(f"Call to collective_rpc method failed: {exc}") from None


class KernelWorker:
    def __init__(self, fail: BaseException | None = None, report: dict | None = None) -> None:
        self.fail, self.report = fail, report

    def ascend_kernel_report(self) -> dict:
        if self.fail is not None:
            raise self.fail
        return self.report


def client_for(engine_client: object) -> TestClient:
    app = Starlette(routes=[Route("/", lambda r: PlainTextResponse("ok"))],
                    middleware=[Middleware(KernelReportMiddleware)])
    app.state.engine_client = engine_client
    app.state.args = None
    return TestClient(app)


def test_stock_workers_answer_404_not_active():
    answer = client_for(EngineClient(StockWorker())).get(REPORT_PATH)
    assert answer.status_code == 404
    assert "not active" in answer.json()["error"] and "ascend_kernel_report" in answer.json()["error"]


def test_a_failing_kernel_worker_answers_500_with_the_reason():
    answer = client_for(EngineClient(KernelWorker(fail=RuntimeError("the KV report broke")))).get(REPORT_PATH)
    assert answer.status_code == 500
    assert "the KV report broke" in answer.json()["error"] and "not active" not in answer.json()["error"]


def test_a_timeout_answers_500_naming_it():
    class Slow:
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            raise asyncio.TimeoutError("no answer within 60 s")

    answer = client_for(Slow()).get(REPORT_PATH)
    assert answer.status_code == 500 and "TimeoutError" in answer.json()["error"]


def test_a_report_that_cannot_merge_answers_500():
    answer = client_for(EngineClient(KernelWorker(report="not a report"))).get(REPORT_PATH)
    assert answer.status_code == 500 and "could not be merged" in answer.json()["error"]


def test_other_paths_pass_through():
    assert client_for(EngineClient(StockWorker())).get("/").text == "ok"


def test_every_rank_keeps_its_own_kv_transfer_counters():
    """At TP > 1 each worker's connector moves its own heads' share of a page: the merged report keeps each
    rank's counters under ``ranks`` (the top level is the first worker's, as for every other field)."""
    from ascend_kernel.cli.engine import merge_worker_reports

    sent = [{"kv_role": "kv_producer", "kv_bytes_sent": 4096}, {"kv_role": "kv_producer", "kv_bytes_sent": 2048}]
    merged = merge_worker_reports([{"rank": rank, "trace": {"steps": 1}, "kv_transfer": counts}
                                   for rank, counts in enumerate(sent)])
    assert merged["kv_transfer"] == sent[0]
    assert [(r["rank"], r["kv_transfer"]) for r in merged["ranks"]] == [(0, sent[0]), (1, sent[1])]
    # no connector (the worker reports None): nothing added to its entry
    (entry,) = merge_worker_reports([{"rank": 0, "trace": {}, "kv_transfer": None}])["ranks"]
    assert entry == {"rank": 0, "dp_rank": 0, "trace": {}}

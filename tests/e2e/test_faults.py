"""A ``--headless`` DP node killed mid-load: the API node fails its open requests in bounded time, then stops.

Two "nodes" on loopback as in ``test_data_parallel.py`` (API node with DP
rank 0, ``--headless`` node with DP rank 1). Eight streamed greedy requests
run on both engines; once every stream has produced a token, the headless
node's process group is SIGKILLed (as a host that loses power: its engine
sends nothing). Without the kernel's liveness watch
(``ascend_kernel/cli/liveness.py``) vLLM 0.32 kept the killed engine's
requests open until the client's 300 s timeout with ``/health`` at 200. Here,
with a 10 s liveness timeout, every open request ends within :data:`BOUND_S`
(the killed engine's with vLLM's ``EngineDeadError``), ``/health`` stops
answering 200, and the API node exits with its engine. A fresh pair of nodes
then answers equal to transformers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ascend_kernel.cli.serving import LocalServer, free_port
from tests.e2e.conftest import CLI, ENGINE_TIMEOUT_S
from tests.e2e.test_data_parallel import (API_KEY, SERVE_ARGS, HeadlessNode, check_answers,
                                          check_report_has_both_ranks, running, server_env)

pytestmark = pytest.mark.e2e

LIVENESS_TIMEOUT_S = 10
#: from the kill to every open request answered, and to the API node's exit: the liveness timeout, one probe
#: interval, vLLM's 5 s server watchdog, and room for a loaded 2-core host
BOUND_S = 60.0
LONG_TOKENS = 400  # long enough that every request is still streaming when the node is killed


def deployment(model: Path, logs: Path) -> tuple[LocalServer, HeadlessNode]:
    dp = ["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
          "--data-parallel-rpc-port", str(free_port())]
    liveness = {"ASCEND_KERNEL_ENGINE_LIVENESS_TIMEOUT_S": str(LIVENESS_TIMEOUT_S)}
    headless = HeadlessNode([*CLI, "serve", str(model), *SERVE_ARGS, *dp, "--headless", "--data-parallel-start-rank",
                             "1"], {**server_env("1"), **liveness}, logs / "node1.log")
    api = LocalServer([*CLI, "serve", str(model), *SERVE_ARGS, *dp, "--api-server-count", "1"],
                      {**server_env("0"), **liveness}, logs / "node0.log", api_key=API_KEY)
    return api, headless


def health(server: LocalServer) -> int | str:
    try:
        with urllib.request.urlopen(f"{server.base_url}/health", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return "refused"


async def stream(api: Any, model: str, prompt: str, started: asyncio.Semaphore) -> tuple[str, str, float]:
    """One streamed request: ("ok" | "error", detail, when it ended)."""
    try:
        chunks = 0
        answer = await api.completions.create(model=model, prompt=prompt, max_tokens=LONG_TOKENS, temperature=0.0,
                                              stream=True, extra_body={"ignore_eos": True})
        async for _ in answer:
            chunks += 1
            if chunks == 1:
                started.release()
        return "ok", f"{chunks} chunks", time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        return "error", f"{type(exc).__name__}: {exc}", time.monotonic()


async def kill_mid_load(api_node: LocalServer, headless: HeadlessNode, model: str) -> tuple[float, list]:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{api_node.base_url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=300) as api:
        started = asyncio.Semaphore(0)
        tasks = [asyncio.create_task(stream(api, model, f"Request {i} starts with", started)) for i in range(8)]
        for _ in tasks:
            await asyncio.wait_for(started.acquire(), timeout=120)
        killed_at = time.monotonic()
        os.killpg(headless.process.pid, signal.SIGKILL)
        return killed_at, await asyncio.gather(*tasks)


def test_killed_headless_node_fails_open_requests_within_bound_and_a_restart_serves(tiny_llama, tmp_path, capsys):
    api, headless = deployment(tiny_llama, tmp_path)
    with running(api, headless, "headless node", headless_stop_s=2):
        server_process = api.process
        assert health(api) == 200
        killed_at, outcomes = asyncio.run(kill_mid_load(api, headless, str(tiny_llama)))
        ended = max(t for _, _, t in outcomes) - killed_at
        failed = [detail for kind, detail, _ in outcomes if kind == "error"]
        # the killed engine's requests fail with vLLM's dead-engine error (not the client's timeout), in time
        assert failed and all("EngineCore encountered an issue" in d for d in failed), outcomes
        assert ended < BOUND_S, outcomes
        # /health never says 200 again; the API node exits (its engine with it)
        answers = []
        while server_process.poll() is None and time.monotonic() - killed_at < BOUND_S:
            answers.append(health(api))
            time.sleep(0.25)
        exited = time.monotonic() - killed_at
        assert server_process.poll() is not None, f"the API node still runs {exited:.0f} s after the kill"
        assert 200 not in answers and set(answers) <= {503, "refused"}, answers
        log = api.log_text()
        assert "did not answer within 10 s" in log, log[-3000:]
    with capsys.disabled():
        print(f"\n[fault bound] {len(failed)}/8 requests failed; all ended {ended:.1f} s after the kill; "
              f"API node exited after {exited:.1f} s; /health answers {sorted(set(map(str, answers)))}")
    # nothing of the old API node runs on: its process group (engine core DP0 included) is gone
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(server_process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("processes of the failed API node still run")

    (tmp_path / "restart").mkdir()
    api, headless = deployment(tiny_llama, tmp_path / "restart")
    with running(api, headless, "restarted headless node"):
        check_answers(api, tiny_llama)
        check_report_has_both_ranks(api)

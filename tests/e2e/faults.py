"""Helpers of the fault test in ``test_data_parallel.py``: a mid-load kill of the ``--headless`` DP node.

Eight streamed greedy requests run on both engines; once every stream has
produced a token, the headless node's process group is SIGKILLed (as a host
that loses power: its engine sends nothing). Without the kernel's liveness
watch (``ascend_kernel/cli/liveness.py``) vLLM 0.32 kept the killed engine's
requests open until the client's 300 s timeout, with ``/health`` at 200.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from ascend_kernel.cli.serving import LocalServer, stop_process

#: from the kill to every open request answered, and to the API node's exit: the liveness timeout, one heartbeat
#: interval, vLLM's 5 s server watchdog, and room for a loaded 2-core host
BOUND_S = 60.0
#: 3 s since the heartbeat (cli/liveness.py) no longer waits for engine steps (it was 10 s with the probe, which
#: a step on a loaded host could exceed); the long-step test runs a 12 s step under it
LIVENESS_TIMEOUT_S = 3
LONG_TOKENS = 400  # long enough that every request is still streaming when the node is killed


def health(server: LocalServer) -> int | str:
    try:
        with urllib.request.urlopen(f"{server.base_url}/health", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return "refused"


async def stream(api: Any, model: str, prompt: str, started: asyncio.Semaphore,
                 headers: dict[str, str] | None = None) -> tuple[str, str, float]:
    """One streamed request: ("ok" | "error", detail, when it ended)."""
    try:
        chunks, finish = 0, None
        answer = await api.completions.create(model=model, prompt=prompt, max_tokens=LONG_TOKENS, temperature=0.0,
                                              stream=True, extra_body={"ignore_eos": True}, extra_headers=headers)
        async for chunk in answer:
            chunks += 1
            if chunks == 1:
                started.release()
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        return "ok", f"{chunks} chunks, finish_reason {finish}", time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        return "error", f"{type(exc).__name__}: {exc}", time.monotonic()


def stop_group(process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM a node's leader (it stops its own children), then SIGKILL its whole process group."""
    stop_process(process, timeout_s, whole_group=True)


def kill_group(process: Any) -> Any:
    """A kill of ``process``'s whole process group (a node that loses power)."""
    return lambda: os.killpg(process.pid, signal.SIGKILL)


async def kill_mid_load(api_node: LocalServer, kill: Any, model: str, api_key: str,
                        running: int = 8, dp_rank: int | None = None) -> tuple[float, list]:
    """Eight streams; once ``running`` of them have a token (a server that runs fewer at once queues the rest),
    ``kill()``; returns when it happened and each stream's outcome.

    ``dp_rank``: every stream is sent to that DP rank's engine (vLLM's ``X-data-parallel-rank`` header), so the
    engine to be killed holds them all. Left to vLLM's balancer, a node still counted busy from an earlier test
    can get none (seen in CI: all eight ran on the surviving engine and finished before the watch fired)."""
    from openai import AsyncOpenAI

    headers = None if dp_rank is None else {"X-data-parallel-rank": str(dp_rank)}
    async with AsyncOpenAI(base_url=f"{api_node.base_url}/v1", api_key=api_key, max_retries=0,
                           timeout=300) as api:
        started = asyncio.Semaphore(0)
        tasks = [asyncio.create_task(stream(api, model, f"Request {i} starts with", started, headers))
                 for i in range(8)]
        for _ in range(running):
            await asyncio.wait_for(started.acquire(), timeout=120)
        killed_at = time.monotonic()
        kill()
        return killed_at, await asyncio.gather(*tasks)

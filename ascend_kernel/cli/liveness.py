"""Fail a server's open requests when an engine on another host dies (vLLM 0.32 would wait forever).

Measured on this host without this watch (the scenario of the fault test in
``tests/e2e/test_data_parallel.py``: two-node DP on loopback, the
``--headless`` node SIGKILLed while 8 streamed requests ran): the 4 requests
on the killed engine stayed open until the client gave up after 300 s,
``/health`` answered 200 throughout, and the server ran on.

Why: vLLM's engine client learns that an engine died in two ways only. The
engine says so on its output socket (``ENGINE_CORE_DEAD``, sent by an engine
that fails, never by one that is killed), or the process monitor of the
engines this server started sees one exit. An engine on a ``--headless``
node is neither: this server did not start it, and ZMQ waits quietly for a
peer that went away.

What: while the server runs, :func:`watch_engines` asks every engine the
client drives a cheap utility question (``is_sleeping``, answered by the
engine-core loop between steps) every :data:`INTERVAL_S`. When one does
not answer within ``ASCEND_KERNEL_ENGINE_LIVENESS_TIMEOUT_S``, the client is
failed through vLLM's own path for a dead engine (:func:`fail_client`): its
``engine_dead`` flag (``/health`` answers 503, new requests are refused) and
an ``EngineDeadError`` in its output queue, which vLLM's output handler hands
to every open request. vLLM's server then shuts down as it does for any dead
engine (its watchdog, every 5 s; ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` keeps
it up, answering 503). A step longer than the timeout reads as a dead engine:
the timeout is generous by default (30 s) for that reason.

Only deployments where the client drives engines this host did not start are
watched (more engines than ``--data-parallel-size-local``); vLLM watches its
own engine processes itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("ascend_kernel")

#: seconds between liveness questions
INTERVAL_S = 2.0
#: the engine-core utility asked (cheap, side-effect free)
PROBE = "is_sleeping"


def remote_engines(engine_client: Any) -> int:
    """How many engines this server's client drives that it did not start (0: nothing to watch)."""
    core = getattr(engine_client, "engine_core", None)
    parallel = engine_client.vllm_config.parallel_config
    driven = len(getattr(core, "core_engines", ()) or ())
    return max(0, driven - parallel.data_parallel_size_local) if hasattr(core, "call_utility_all_async") else 0


def fail_client(core: Any, reason: str) -> None:
    """Mark vLLM's engine client dead the way it marks itself when an engine reports its own death."""
    from vllm.v1.engine.exceptions import EngineDeadError

    logger.error("ascend-kernel: %s; failing the open requests and marking the engine dead", reason)
    core.resources.engine_dead = True
    core.outputs_queue.put_nowait(EngineDeadError())


async def watch_engines(engine_client: Any, timeout_s: float, interval_s: float = INTERVAL_S) -> str:
    """Ask the engines until one does not answer (then fail the client) or the client is dead; say which."""
    core = engine_client.engine_core
    while not core.resources.engine_dead:
        try:
            await asyncio.wait_for(core.call_utility_all_async(PROBE), timeout=timeout_s)
        except asyncio.TimeoutError:
            if core.resources.engine_dead:
                break
            fail_client(core, f"an engine did not answer within {timeout_s:g} s "
                              f"(ASCEND_KERNEL_ENGINE_LIVENESS_TIMEOUT_S); it is taken as dead")
            return "failed"
        except Exception:  # noqa: BLE001 - the client is shutting down or already failed: nothing left to watch
            if not core.resources.engine_dead:
                logger.exception("ascend-kernel: the engine liveness watch stopped")
            return "stopped"
        await asyncio.sleep(interval_s)
    return "dead"


def start_watch(app_state: Any) -> asyncio.Task | None:
    """Start :func:`watch_engines` for this server's engine client when it drives remote engines."""
    from ascend_kernel.settings import load_settings

    engine_client = getattr(app_state, "engine_client", None)
    if engine_client is None or remote_engines(engine_client) == 0:
        return None
    timeout_s = load_settings().engine_liveness_timeout_s
    logger.info("ascend-kernel: watching %d engine(s) on other hosts (liveness timeout %g s)",
                remote_engines(engine_client), timeout_s)
    return asyncio.get_running_loop().create_task(watch_engines(engine_client, timeout_s),
                                                  name="ascend-kernel-engine-liveness")

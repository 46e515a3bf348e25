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

What: a heartbeat that no engine step can hold up. The ``--headless`` node's
launcher process (``ascend-kernel serve --headless``, the process that
started that node's engines and exits when one of them dies: vLLM's
``monitor_engine_liveness``) runs :class:`HeartbeatSender`, a daemon thread
that sends one UDP datagram every :data:`HEARTBEAT_INTERVAL_S` to the API
node's DP address at the DP RPC port (UDP: vLLM's handshake holds the TCP
port of that number, never the UDP one). The datagram names the DP ranks of
that node's engines. The launcher runs no model, so a step of any length on
its engines does not delay a beat. The API server's watch
(:func:`watch_heartbeats`) receives them; when a node it has heard from
sends nothing for ``ASCEND_KERNEL_ENGINE_LIVENESS_TIMEOUT_S``, the client is
failed through vLLM's own path for a dead engine (:func:`fail_client`): its
``engine_dead`` flag (``/health`` answers 503, new requests are refused) and
an ``EngineDeadError`` in its output queue, which vLLM's output handler hands
to every open request. vLLM's server then shuts down as it does for any dead
engine (its watchdog, every 5 s; ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` keeps
it up, answering 503).

Before the heartbeat, the watch asked each engine a utility question
(``is_sleeping``), which the engine-core loop answers only between steps, so
a step longer than the timeout read as a dead engine (measured: a 7 s
prefill under a 3 s timeout got a 500 and the server exited). Every API server process of the API node watches (vLLM starts
``--api-server-count`` of them, by default one per local DP rank), but only
one can bind the heartbeat port: the others bind a port of their own on the
same address and *subscribe* to the one that holds it (a datagram every
beat interval), which relays each beat it receives to its subscribers. So
all of them see the heartbeats, whatever the API server count (measured
before: with ``-dp 2`` the second API server fell back to the probe below
and took a busy engine as dead). The probe (:func:`watch_engines`) remains
the fallback only where no UDP port can be bound at all; it keeps the old
caveat, which the log says.

What a beat proves: the node's launcher runs, hence (vLLM's headless monitor)
all its engine processes run. An engine process that is alive but stuck is
not found (nor was it by vLLM before). A node that never beats (one not
started by ``ascend-kernel serve --headless``) is not watched; the log says so
once the timeout has passed without a beat.

Only deployments where the client drives engines this host did not start are
watched (more engines than ``--data-parallel-size-local``); vLLM watches its
own engine processes itself.

With more than one API server, the node does not end when they do: vLLM's
launcher (``run_multi_api_server``) waits for each of its processes to end
and takes an API server that exits with status 0 as one that finished
normally, then waits on for the node's engine and DP coordinator, which run
on. Whether it noticed depended on a race (an API server's status read
while still unknown counts as a death; read as 0, the launcher waited
forever: seen once in CI, the API node still up 64 s after the kill, where
other runs ended in 8-11 s). So an API server whose watch failed the client
asks its launcher to stop (:func:`stop_launcher`, SIGTERM: the launcher's
own stop, which ends every API server, engine and coordinator of the node)
once its own lifespan has ended, after the failed requests were answered.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from typing import Any

logger = logging.getLogger("ascend_kernel")

#: seconds between liveness questions (the fallback probe)
INTERVAL_S = 2.0
#: the engine-core utility asked (cheap, side-effect free)
PROBE = "is_sleeping"
#: seconds between a headless node's heartbeats
HEARTBEAT_INTERVAL_S = 1.0
#: first word of a heartbeat datagram: ``ascend-kernel-beat <first DP rank> <engines>``
BEAT = b"ascend-kernel-beat"
#: the datagram an API server that could not bind the heartbeat port sends to the one that did: relay beats to me
SUBSCRIBE = b"ascend-kernel-subscribe"
#: seconds a subscriber is relayed to after its last subscription (it renews every heartbeat interval)
SUBSCRIPTION_TTL_S = 5 * HEARTBEAT_INTERVAL_S
#: how vLLM's multi-API-server launcher names the API server processes it starts (``APIServerProcessManager``)
API_SERVER_PROCESS_PREFIX = "ApiServer_"


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


# -- the headless node's side ---------------------------------------------------------------------------------


class HeartbeatSender:
    """A daemon thread sending ``BEAT first count`` by UDP to ``(host, port)`` every ``interval_s`` until stopped."""

    def __init__(self, host: str, port: int, first_rank: int, engines: int,
                 interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.target = (host, port)
        self.message = b"%s %d %d" % (BEAT, first_rank, engines)
        self.interval_s = interval_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ascend-kernel-heartbeat", daemon=True)

    def start(self) -> HeartbeatSender:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        family = socket.getaddrinfo(self.target[0], self.target[1], type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            while not self._stop.is_set():
                try:
                    sock.sendto(self.message, self.target)
                    self.sent += 1
                except OSError:  # the API node is not up yet, or unreachable for now: beat on
                    pass
                self._stop.wait(self.interval_s)


def start_heartbeat(args: Any) -> HeartbeatSender | None:
    """For ``serve --headless`` of DP engines (``args``: vLLM's parsed serve arguments): beat to the API node."""
    if not getattr(args, "headless", False) or (getattr(args, "data_parallel_size", 1) or 1) <= 1:
        return None  # not a DP node without a server (multi-node TP followers are watched by their leader)
    from vllm.config import ParallelConfig

    host = args.data_parallel_address or getattr(args, "master_addr", None) or ParallelConfig.data_parallel_master_ip
    port = args.data_parallel_rpc_port or ParallelConfig.data_parallel_rpc_port
    first = getattr(args, "data_parallel_start_rank", None) or 0
    engines = args.data_parallel_size_local or 1
    logger.info("ascend-kernel: heartbeat of DP rank(s) %d-%d to %s:%d/udp every %g s",
                first, first + engines - 1, host, port, HEARTBEAT_INTERVAL_S)
    return HeartbeatSender(host, port, first, engines).start()


# -- the API node's side --------------------------------------------------------------------------------------


class HeartbeatReceiver(asyncio.DatagramProtocol):
    """When each sender (keyed by its first DP rank) was last heard from, on this loop's clock.

    The receiver that holds the heartbeat port also relays every beat to the API servers of this host that
    subscribed (each renews within :data:`SUBSCRIPTION_TTL_S`).
    """

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.engines: dict[int, int] = {}
        self.subscribers: dict[Any, float] = {}
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        words = data.split()
        now = time.monotonic()
        if words == [SUBSCRIBE]:
            self.subscribers[addr] = now
        elif len(words) == 3 and words[0] == BEAT and words[1].isdigit() and words[2].isdigit():
            first = int(words[1])
            self.last[first] = now
            self.engines[first] = int(words[2])
            self._relay(data, now)

    def _relay(self, beat: bytes, now: float) -> None:
        for addr, renewed in list(self.subscribers.items()):
            if now - renewed > SUBSCRIPTION_TTL_S:
                del self.subscribers[addr]  # that API server is gone (or holds the port itself now)
            elif self.transport is not None:
                self.transport.sendto(beat, addr)

    def ranks(self, first: int) -> str:
        return f"{first}" if self.engines.get(first, 1) == 1 else f"{first}-{first + self.engines[first] - 1}"


async def bind_receiver(host: str, port: int) -> tuple[Any, HeartbeatReceiver]:
    """A UDP endpoint on ``(host, port)`` collecting heartbeats (OSError when it cannot be bound)."""
    transport, receiver = await asyncio.get_running_loop().create_datagram_endpoint(
        HeartbeatReceiver, local_addr=(host, port))
    return transport, receiver


async def subscribe(transport: Any, holder: tuple[str, int], interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
    """Ask the API server that holds the heartbeat port, every ``interval_s``, to relay the beats to ``transport``."""
    while not transport.is_closing():
        transport.sendto(SUBSCRIBE, holder)
        await asyncio.sleep(interval_s)


async def watch_heartbeats(core: Any, receiver: HeartbeatReceiver, timeout_s: float,
                           check_s: float = 0.25) -> str:
    """Until a node heard from is silent for ``timeout_s`` (then fail the client) or the client is dead; say which."""
    started = time.monotonic()
    warned = False
    while not core.resources.engine_dead:
        now = time.monotonic()
        silent = [first for first, last in receiver.last.items() if now - last > timeout_s]
        if silent:
            ranks = ", ".join(receiver.ranks(first) for first in sorted(silent))
            fail_client(core, f"the node of DP rank(s) {ranks} sent no heartbeat for {timeout_s:g} s "
                              f"(ASCEND_KERNEL_ENGINE_LIVENESS_TIMEOUT_S); it is taken as dead")
            return "failed"
        if not receiver.last and not warned and now - started > timeout_s:
            warned = True
            logger.warning("ascend-kernel: no engine heartbeat in %g s; engines on other hosts are not watched "
                           "until one arrives (is the node started with `ascend-kernel serve --headless`?)",
                           timeout_s)
        await asyncio.sleep(check_s)
    return "dead"


async def watch_engines(engine_client: Any, timeout_s: float, interval_s: float = INTERVAL_S) -> str:
    """The fallback: ask the engines until one does not answer (then fail the client) or the client is dead."""
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


async def receive_beats(host: str, port: int) -> tuple[Any, HeartbeatReceiver, asyncio.Task | None]:
    """Hold the heartbeat port; where another API server of this host holds it, subscribe to its relay.

    Returns the endpoint, its receiver and the subscription task (None when this process holds the port);
    OSError when neither can be bound.
    """
    try:
        transport, receiver = await bind_receiver(host, port)
        return transport, receiver, None
    except OSError as held:
        transport, receiver = await bind_receiver(host, 0)
        logger.info("ascend-kernel: another API server holds the heartbeat port %s:%d/udp (%s); this one "
                    "receives the beats it relays", host, port, held)
        return transport, receiver, asyncio.get_running_loop().create_task(subscribe(transport, (host, port)))


async def watch(engine_client: Any, timeout_s: float) -> str:
    """Heartbeats on the DP address's UDP port (held here or relayed); the utility probe where no port binds."""
    parallel = engine_client.vllm_config.parallel_config
    host, port = parallel.data_parallel_master_ip, parallel.data_parallel_rpc_port
    try:
        transport, receiver, subscription = await receive_beats(host, port)
    except OSError as exc:
        logger.warning("ascend-kernel: cannot receive engine heartbeats on %s/udp (%s); asking the engines "
                       "instead, where a step longer than %g s reads as a dead engine", host, exc, timeout_s)
        return hand_to_vllm(engine_client, await watch_engines(engine_client, timeout_s))
    try:
        outcome = await watch_heartbeats(engine_client.engine_core, receiver, timeout_s)
    finally:
        transport.close()
        if subscription is not None:
            subscription.cancel()
    return hand_to_vllm(engine_client, outcome)


def hand_to_vllm(engine_client: Any, outcome: str) -> str:
    """After the watch failed the client, let vLLM's server watchdog see a dead engine in every API server.

    The watchdog shuts a server down only when the client is dead *and* its
    output handler has ended (``errored and not is_running``). vLLM starts
    that handler with a server's first request, so an API server that has
    served none (with ``--api-server-count`` 2, the kernel's socket balancer
    may have given every request to the other one) would answer 503 forever
    and keep the node up. Starting vLLM's own handler here lets it take the
    ``EngineDeadError`` from the queue and end, as it does in a busy server.
    """
    if outcome == "failed":
        from ascend_kernel.upstream import start_output_handler

        start_output_handler(engine_client)
    return outcome


def stop_launcher(watch_task: Any) -> int | None:
    """When ``watch_task`` failed the client in an API server that vLLM's launcher started, SIGTERM that launcher.

    Called as this API server's lifespan ends (vLLM's watchdog stopped it after its requests were answered).
    Returns the launcher's pid where it was signalled; None where the watch did not fail, or this server is no
    launcher's child (one API server: it is the node's main process, whose end ends the node).
    """
    if not isinstance(watch_task, asyncio.Task) or not watch_task.done() or watch_task.cancelled():
        return None
    if watch_task.exception() is not None or watch_task.result() != "failed":
        return None
    launcher = multiprocessing.parent_process()
    if launcher is None or not multiprocessing.current_process().name.startswith(API_SERVER_PROCESS_PREFIX):
        return None
    if os.getppid() != launcher.pid:  # the launcher ended (this process was re-parented): its pid may be another's
        return None
    logger.warning("ascend-kernel: an engine on another host is dead; asking this node's launcher (pid %d) to "
                   "stop its API servers, engines and coordinator (it waits on them otherwise)", launcher.pid)
    try:
        os.kill(launcher.pid, signal.SIGTERM)
    except ProcessLookupError:  # the launcher already ended
        return None
    return launcher.pid


def start_watch(app_state: Any) -> asyncio.Task | None:
    """Start :func:`watch` for this server's engine client when it drives remote engines."""
    from ascend_kernel.settings import load_settings

    engine_client = getattr(app_state, "engine_client", None)
    if engine_client is None or remote_engines(engine_client) == 0:
        return None
    timeout_s = load_settings().engine_liveness_timeout_s
    logger.info("ascend-kernel: watching %d engine(s) on other hosts by heartbeat (liveness timeout %g s)",
                remote_engines(engine_client), timeout_s)
    return asyncio.get_running_loop().create_task(watch(engine_client, timeout_s),
                                                  name="ascend-kernel-engine-liveness")

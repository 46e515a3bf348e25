"""The engine-liveness watch of ``ascend-kernel serve``: the heartbeat (a real sender thread and a real UDP
receiver on 127.0.0.1) and the fallback probe, against a stand-in of vLLM's engine client.

The stand-in has what the watch touches (``call_utility_all_async``,
``resources.engine_dead``, ``outputs_queue``, ``core_engines``); the watch and
vLLM's ``EngineDeadError`` are the real ones. The end-to-end run (a killed
``--headless`` node) is ``tests/e2e/test_data_parallel.py`` (``test_killed_headless_node_...``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ascend_kernel.cli.liveness import PROBE, remote_engines, watch_engines


class Core:
    def __init__(self, engines: int, answers: int | None) -> None:
        self.core_engines = [bytes([i]) for i in range(engines)]
        self.resources = SimpleNamespace(engine_dead=False)
        self.outputs_queue: asyncio.Queue = asyncio.Queue()
        self.answers = answers  # answer this many probes, then hang (None: always answer)
        self.asked: list[str] = []

    async def call_utility_all_async(self, method: str, *args: object) -> list[bool]:
        self.asked.append(method)
        if self.answers is not None and len(self.asked) > self.answers:
            await asyncio.Event().wait()  # an engine that went away answers nothing
        return [False] * len(self.core_engines)


def client(core: Core, local: int) -> SimpleNamespace:
    return SimpleNamespace(engine_core=core, vllm_config=SimpleNamespace(
        parallel_config=SimpleNamespace(data_parallel_size_local=local)))


def test_an_engine_that_stops_answering_fails_the_client_through_vllms_dead_engine_path():
    from vllm.v1.engine.exceptions import EngineDeadError

    async def run() -> tuple[str, Core]:
        core = Core(engines=2, answers=3)
        return await watch_engines(client(core, 1), timeout_s=0.2, interval_s=0.01), core

    outcome, core = asyncio.run(run())
    assert outcome == "failed" and core.asked == [PROBE] * 4
    assert core.resources.engine_dead
    assert isinstance(core.outputs_queue.get_nowait(), EngineDeadError)


def test_answering_engines_are_left_alone_until_the_client_is_dead():
    async def run() -> tuple[str, Core]:
        core = Core(engines=2, answers=None)
        watch = asyncio.create_task(watch_engines(client(core, 1), timeout_s=1.0, interval_s=0.01))
        while len(core.asked) < 5:
            await asyncio.sleep(0.01)
        core.resources.engine_dead = True  # vLLM found out by itself (or shut down)
        return await watch, core

    outcome, core = asyncio.run(run())
    assert outcome == "dead" and core.outputs_queue.empty()


def test_only_engines_this_server_did_not_start_are_watched():
    assert remote_engines(client(Core(engines=2, answers=None), local=1)) == 1  # API node + a --headless node
    assert remote_engines(client(Core(engines=2, answers=None), local=2)) == 0  # one host: vLLM watches them
    no_dp = SimpleNamespace(engine_core=SimpleNamespace(), vllm_config=client(Core(1, None), 1).vllm_config)
    assert remote_engines(no_dp) == 0


# -- the heartbeat: a real sender thread and a real receiver on 127.0.0.1 (UDP) ---------------------------------


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_beating_node_whose_engine_thread_is_busy_is_never_taken_as_dead():
    """The sender beats from its own thread while the sending process's main thread computes for 3 s
    (three times the timeout), holding the GIL most of the time: the watch leaves the client alone. The
    timeout is 20 beats long, so a loaded host (the suite runs two workers on two cores) cannot make
    a beating node miss it."""
    from ascend_kernel.cli.liveness import HeartbeatSender, bind_receiver, watch_heartbeats

    async def run() -> tuple[str, Core, HeartbeatReceiver]:
        port = _free_udp_port()
        transport, receiver = await bind_receiver("127.0.0.1", port)
        sender = HeartbeatSender("127.0.0.1", port, first_rank=1, engines=1, interval_s=0.05).start()
        core = Core(engines=2, answers=0)  # the utility probe would hang: only the heartbeat is asked
        watch = asyncio.create_task(watch_heartbeats(core, receiver, timeout_s=1.0, check_s=0.02))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _spin, 3.0)  # a long "step" in another thread of this process
        core.resources.engine_dead = True
        outcome = await watch
        sender.stop()
        transport.close()
        return outcome, core, receiver

    from ascend_kernel.cli.liveness import HeartbeatReceiver

    outcome, core, receiver = asyncio.run(run())
    assert outcome == "dead" and core.outputs_queue.empty() and core.asked == []
    assert list(receiver.last) == [1] and receiver.engines == {1: 1}


def _spin(seconds: float) -> int:
    import time

    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(1000))
    return n


def test_a_node_that_stops_beating_fails_the_client_within_the_timeout():
    from vllm.v1.engine.exceptions import EngineDeadError

    from ascend_kernel.cli.liveness import HeartbeatSender, bind_receiver, watch_heartbeats

    async def run() -> tuple[str, Core, float, str]:
        port = _free_udp_port()
        transport, receiver = await bind_receiver("127.0.0.1", port)
        sender = HeartbeatSender("127.0.0.1", port, first_rank=2, engines=2, interval_s=0.05).start()
        core = Core(engines=4, answers=None)
        watch = asyncio.create_task(watch_heartbeats(core, receiver, timeout_s=1.0, check_s=0.02))
        await asyncio.sleep(1.5)
        assert not watch.done()
        sender.stop()  # the node goes quiet (its launcher is gone)
        stopped = time.monotonic()
        outcome = await asyncio.wait_for(watch, timeout=5)
        transport.close()
        return outcome, core, time.monotonic() - stopped, receiver.ranks(2)

    import time

    outcome, core, took, ranks = asyncio.run(run())
    assert outcome == "failed" and core.resources.engine_dead
    assert isinstance(core.outputs_queue.get_nowait(), EngineDeadError)
    assert ranks == "2-3"
    # the timeout (1 s) after the last beat (at most one 0.05 s interval before the stop), plus one check;
    # the upper bound is loose: a loaded host may delay the watch's wake-up, never bring it forward
    assert 0.9 < took < 3.0, took


def test_other_datagrams_are_not_heartbeats_and_a_silent_start_only_warns(caplog):
    import socket

    from ascend_kernel.cli.liveness import bind_receiver, watch_heartbeats

    async def run() -> tuple[str, Core, dict]:
        port = _free_udp_port()
        transport, receiver = await bind_receiver("127.0.0.1", port)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for junk in (b"hello", b"ascend-kernel-beat x 1", b"ascend-kernel-beat 1"):
                sock.sendto(junk, ("127.0.0.1", port))
        core = Core(engines=2, answers=None)
        watch = asyncio.create_task(watch_heartbeats(core, receiver, timeout_s=0.1, check_s=0.02))
        await asyncio.sleep(0.4)
        core.resources.engine_dead = True
        outcome = await watch
        transport.close()
        return outcome, core, receiver.last

    with caplog.at_level("WARNING", logger="ascend_kernel"):
        outcome, core, last = asyncio.run(run())
    assert outcome == "dead" and last == {} and core.outputs_queue.empty()
    assert "no engine heartbeat" in caplog.text


def test_a_headless_dp_node_beats_to_the_dp_address_and_others_do_not():
    from ascend_kernel.cli.liveness import start_heartbeat

    base = dict(headless=True, data_parallel_size=2, data_parallel_size_local=1, data_parallel_start_rank=1,
                data_parallel_address="127.0.0.1", data_parallel_rpc_port=_free_udp_port(), master_addr=None)
    sender = start_heartbeat(SimpleNamespace(**base))
    try:
        assert sender is not None and sender.target == ("127.0.0.1", base["data_parallel_rpc_port"])
        assert sender.message == b"ascend-kernel-beat 1 1"
    finally:
        sender.stop()
    assert start_heartbeat(SimpleNamespace(**{**base, "headless": False})) is None  # the API node
    assert start_heartbeat(SimpleNamespace(**{**base, "data_parallel_size": 1})) is None  # multi-node TP follower


def test_every_api_server_of_the_host_sees_the_beats_whoever_holds_the_port():
    """vLLM starts several API server processes on the API node (``--api-server-count``, by default one per local
    DP rank); one binds the heartbeat port. The others subscribe to its relay: a busy node is dead to none of them,
    and a node that goes quiet is dead to every one of them within the timeout."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from ascend_kernel.cli.liveness import HeartbeatSender, receive_beats, watch_heartbeats

    async def run() -> tuple[list[str], list[Core], list[Any], float]:
        port = _free_udp_port()
        holder = await receive_beats("127.0.0.1", port)
        subscriber = await receive_beats("127.0.0.1", port)  # the port is taken: this one subscribes
        assert holder[2] is None and subscriber[2] is not None
        subscriber[2].cancel()  # renew faster than the production interval, for a short test
        renew = asyncio.create_task(_renew(subscriber[0], port))
        sender = HeartbeatSender("127.0.0.1", port, first_rank=1, engines=1, interval_s=0.05).start()
        cores = [Core(engines=2, answers=0), Core(engines=2, answers=0)]
        watches = [asyncio.create_task(watch_heartbeats(core, endpoint[1], timeout_s=1.0, check_s=0.02))
                   for core, endpoint in zip(cores, (holder, subscriber))]
        await asyncio.sleep(2.0)  # beats arrive at both: nobody is taken as dead
        assert not any(w.done() for w in watches)
        sender.stop()
        stopped = time.monotonic()
        outcomes = await asyncio.wait_for(asyncio.gather(*watches), timeout=5)
        took = time.monotonic() - stopped
        renew.cancel()
        for endpoint in (holder, subscriber):
            endpoint[0].close()
        return outcomes, cores, [holder[1], subscriber[1]], took

    import time

    outcomes, cores, receivers, took = asyncio.run(run())
    assert outcomes == ["failed", "failed"], outcomes
    assert all(isinstance(core.outputs_queue.get_nowait(), EngineDeadError) for core in cores)
    assert all(list(r.last) == [1] for r in receivers)  # the subscriber heard the node through the relay
    assert len(receivers[0].subscribers) == 1 and not receivers[1].subscribers
    assert took < 3.5, took


async def _renew(transport: Any, port: int) -> None:
    from ascend_kernel.cli.liveness import subscribe

    await subscribe(transport, ("127.0.0.1", port), interval_s=0.05)


# -- after the watch: vLLM's own server watchdog must see the dead engine, in a server that served nothing -------


class OutputCore(Core):
    """The stand-in core with the output side of vLLM's ``AsyncMPClient``: an exception in the queue is raised."""

    async def get_output_async(self) -> Any:
        outputs = await self.outputs_queue.get()
        if isinstance(outputs, Exception):
            raise outputs
        return outputs


def _idle_async_llm(core: OutputCore) -> Any:
    """vLLM's real ``AsyncLLM`` as an API server holds it before its first request (no output handler yet)."""
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor

    llm = AsyncLLM.__new__(AsyncLLM)
    llm.engine_core = core
    llm.output_processor = OutputProcessor(None, log_stats=False)
    llm.log_stats = False
    llm.logger_manager = None
    llm.renderer = SimpleNamespace(mm_processor_cache=None)
    llm.output_handler = None
    return llm


def test_a_failed_client_that_served_no_request_still_lets_vllms_watchdog_shut_the_server_down():
    """Seen in CI: the API node of the killed-node test never exited, with 8/8 requests failed in time.

    vLLM's watchdog (``terminate_if_errored``) shuts a server down only when its
    client is dead and its output handler has ended; an API server that had
    been given no request has no handler, so it stayed up at 503. The watch's
    hand-over starts vLLM's handler, which ends on the ``EngineDeadError``."""
    import uvicorn
    from vllm.entrypoints.launchers.launcher import terminate_if_errored

    from ascend_kernel.cli.liveness import fail_client, hand_to_vllm

    async def run() -> tuple[bool, bool, Any]:
        llm = _idle_async_llm(OutputCore(engines=2, answers=None))
        server = uvicorn.Server(uvicorn.Config(app=None))
        fail_client(llm.engine_core, "a test's dead node")
        terminate_if_errored(server, llm)
        before = server.should_exit  # what vLLM alone does with an idle client: nothing
        assert hand_to_vllm(llm, "failed") == "failed"
        await asyncio.wait_for(asyncio.shield(llm.output_handler), timeout=5)
        terminate_if_errored(server, llm)
        return before, server.should_exit, llm

    before, after, llm = asyncio.run(run())
    assert before is False and after is True
    assert llm.errored and not llm.is_running


def test_the_hand_over_leaves_a_client_the_watch_did_not_fail_alone():
    from ascend_kernel.cli.liveness import hand_to_vllm

    async def run() -> Any:
        llm = _idle_async_llm(OutputCore(engines=2, answers=None))
        for outcome in ("dead", "stopped"):
            assert hand_to_vllm(llm, outcome) == outcome
        return llm

    assert asyncio.run(run()).output_handler is None


# -- the node's end: an API server whose watch failed stops vLLM's launcher ---------------------------------------

_LAUNCHER = r'''
import asyncio, json, multiprocessing, signal, sys, time
from ascend_kernel.cli.liveness import stop_launcher

def api_server(outcome):
    async def watch():
        return outcome
    async def run():
        task = asyncio.get_running_loop().create_task(watch())
        await task
        return stop_launcher(task)
    asyncio.run(run())

signals = []
signal.signal(signal.SIGTERM, lambda signum, frame: signals.append(signum))
outcome, name = sys.argv[1], sys.argv[2]
child = multiprocessing.get_context("fork").Process(target=api_server, args=(outcome,), name=name)
child.start()
child.join(30)
deadline = time.monotonic() + 2
while not signals and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"exitcode": child.exitcode, "sigterm": signals == [signal.SIGTERM]}))
'''


def _launch(outcome: str, name: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LAUNCHER, outcome, name], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_api_server_whose_watch_failed_the_client_stops_the_launcher_that_started_it():
    """vLLM's multi-API-server launcher reads an API server's exit 0 as a normal end and waits on for the node's
    engine and coordinator (a race decided whether a killed node's API node ever ended). A real launcher process
    and a real API-server child named as vLLM names them: the failed watch SIGTERMs the launcher, once."""
    assert _launch("failed", "ApiServer_1") == {"exitcode": 0, "sigterm": True}


def test_no_launcher_is_stopped_by_a_watch_that_did_not_fail_or_by_a_process_vllm_did_not_start_as_api_server():
    assert _launch("dead", "ApiServer_0") == {"exitcode": 0, "sigterm": False}  # vLLM's own end, or a shutdown
    assert _launch("failed", "SomeWorker-1") == {"exitcode": 0, "sigterm": False}


def test_the_launcher_stop_needs_a_finished_watch_and_a_parent_process():
    from ascend_kernel.cli.liveness import stop_launcher

    async def run() -> list[Any]:
        pending = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        failed = asyncio.get_running_loop().create_task(asyncio.sleep(0, result="failed"))
        await failed
        # a running watch, no watch, and a failed watch in this (pytest's main) process: no launcher above it
        answers = [stop_launcher(pending), stop_launcher(False), stop_launcher(failed)]
        pending.cancel()
        return answers

    assert asyncio.run(run()) == [None, None, None]


def test_vllm_names_its_api_server_processes_as_the_launcher_stop_expects():
    import inspect

    from vllm.v1.utils import APIServerProcessManager

    from ascend_kernel.cli.liveness import API_SERVER_PROCESS_PREFIX

    assert f'name=f"{API_SERVER_PROCESS_PREFIX}{{i}}"' in inspect.getsource(APIServerProcessManager.__init__)

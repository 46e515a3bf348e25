"""The engine-liveness watch of ``ascend-kernel serve`` against a stand-in of vLLM's engine client.

The stand-in has what the watch touches (``call_utility_all_async``,
``resources.engine_dead``, ``outputs_queue``, ``core_engines``); the watch and
vLLM's ``EngineDeadError`` are the real ones. The end-to-end run (a killed
``--headless`` node) is ``tests/e2e/test_data_parallel.py`` (``test_killed_headless_node_...``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

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

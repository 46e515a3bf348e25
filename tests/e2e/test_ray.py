"""vLLM's Ray executor on the kernel's CPU platform: TP=2 over a two-node Ray cluster on loopback.

One cluster for the module: ``ray start --head --num-cpus 1`` and a second
``ray start --address HEAD --num-cpus 1``, each in its own process group,
temp dir and ports, each node binding its worker to its own core
(``VLLM_CPU_OMP_THREADS_BIND``, which vLLM's workers keep from their node's
environment). The kernel's CPU platform asks for one Ray ``CPU`` per worker
(``ray_device_key``), so a TP=2 placement group has to take one bundle on
each node: the workers run on both "nodes", as on two machines. Why the
platform also swaps in its own executor subclass:
``ascend_kernel/platform/ray_executor.py`` (and ``tests/test_ray_cpu.py``).

Both scenarios answer equal to transformers' greedy tokens, and both TP ranks
report. Token authentication is off (``RAY_AUTH_MODE=disabled``) because
every process is on this host; a real cluster should keep Ray's default.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from ascend_kernel.cli.serving import REPORT_PATH, LocalServer, free_port
from tests.e2e.conftest import CLI, ENGINE_TIMEOUT_S, REPO, clean_env, hf_greedy, run_cli, tokens
from tests.e2e.faults import stop_group

pytestmark = pytest.mark.e2e

RAY = str(Path(sys.executable).with_name("ray"))
API_KEY = "sk-ascend-kernel-ray"
MAX_TOKENS = 6
PROMPTS = ["The capital of France is", "Once upon a time, there was"]
READY_LINE = "will now block forever"


def ray_env(**extra: str) -> dict[str, str]:
    return clean_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", ASCEND_KERNEL_DEVICE="cpu", **extra)


class RayNode:
    """``ray start --block ...`` in its own process group; ready once Ray says it blocks."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen([RAY, "start", "--block", *args], env=env, cwd=REPO, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not come up:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM lets ``ray start --block`` stop its raylet (and its workers); then SIGKILL the group."""
        stop_group(self.process, timeout_s=30)


class PortBook:
    """Free ports for a cluster's nodes, never one twice and never one inside a node's worker-port range.

    Each port is free when chosen, but the OS hands a closed port out again: a port chosen for one component
    could be the next one's too, or fall inside the range a node gives its workers (Ray refuses to start when
    two of its components share a port: seen once in CI, the runtime-env agent's port inside the worker range).
    """

    WORKER_PORTS = 51

    def __init__(self) -> None:
        self.handed_out: set[int] = set()

    def port(self) -> int:
        while (port := free_port()) in self.handed_out:
            pass
        self.handed_out.add(port)
        return port

    def worker_range(self) -> int:
        """The first of WORKER_PORTS consecutive ports, each free now and none handed out before."""
        for _ in range(200):
            low = free_port()
            ports = range(low, low + self.WORKER_PORTS)
            if ports[-1] <= 65535 and self.handed_out.isdisjoint(ports) and all(map(port_is_free, ports)):
                self.handed_out.update(ports)
                return low
        raise RuntimeError(f"no {self.WORKER_PORTS} consecutive free ports found for Ray's workers")

    def node_ports(self) -> list[str]:
        """Every port a node opens, so two nodes (and other Ray users) on this host never collide."""
        names = ["--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
                 "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--metrics-export-port"]
        low = self.worker_range()
        args = [x for name in names for x in (name, str(self.port()))]
        return [*args, "--min-worker-port", str(low), "--max-worker-port", str(low + self.WORKER_PORTS - 1)]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kernel_workers(temp_dir: str) -> int:
    """How many Ray worker log files of one node name the kernel's worker class."""
    return sum("KernelCpuRayWorkerProc" in p.read_text(errors="replace")
               for p in Path(temp_dir).glob("session_*/logs/worker-*"))


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("ray")
    # short temp dirs: Ray's unix sockets live there, and socket paths are limited to 107 bytes
    temp_dirs = [tempfile.mkdtemp(prefix="akray", dir="/tmp") for _ in range(2)]
    ports = PortBook()
    port = ports.port()
    common = ["--num-cpus", "1", "--num-gpus", "0", "--node-ip-address", "127.0.0.1",
              "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
    nodes = []
    try:
        head = RayNode(["--head", "--port", str(port), "--include-dashboard", "false",
                        "--ray-client-server-port", str(ports.port()), "--temp-dir", temp_dirs[0], *common,
                        *ports.node_ports()], ray_env(VLLM_CPU_OMP_THREADS_BIND="0"), logs / "head.log")
        nodes.append(head)
        head.wait_ready()
        worker = RayNode(["--address", f"127.0.0.1:{port}", "--temp-dir", temp_dirs[1], *common, *ports.node_ports()],
                         ray_env(VLLM_CPU_OMP_THREADS_BIND="1"), logs / "node1.log")
        nodes.append(worker)
        worker.wait_ready()
        yield {"address": f"127.0.0.1:{port}", "temp_dirs": temp_dirs}
    finally:
        for node in reversed(nodes):
            node.stop()
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


def check_workers_on_both_nodes(cluster: dict[str, Any], before: list[int]) -> None:
    """Each node started kernel Ray workers for this run (the TP=2 group spans both; Ray writes several logs each)."""
    after = [kernel_workers(d) for d in cluster["temp_dirs"]]
    assert all(a > b for a, b in zip(after, before)), (before, after)


def check_tp_ranks(ranks: list[dict[str, Any]]) -> None:
    assert [(r["dp_rank"], r["rank"]) for r in ranks] == [(0, 0), (0, 1)], ranks
    assert ranks[0]["trace"] == ranks[1]["trace"]  # TP ranks run every step together
    assert ranks[1]["trace"]["attention_states"].get("PrefillNoCache", 0) > 0


def test_serve_tp2_on_a_two_node_ray_cluster_answers_like_transformers(ray_cluster, tiny_llama, tmp_path):
    """``ascend-kernel serve --distributed-executor-backend ray -tp 2``: answers, and the report lists both ranks."""
    from openai import AsyncOpenAI

    args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--max-num-seqs", "4",
            "--api-key", API_KEY, "--distributed-executor-backend", "ray", "--tensor-parallel-size", "2"]
    server = LocalServer([*CLI, "serve", str(tiny_llama), *args], ray_env(RAY_ADDRESS=ray_cluster["address"]),
                         tmp_path / "server.log", api_key=API_KEY)
    before = [kernel_workers(d) for d in ray_cluster["temp_dirs"]]
    server.start(timeout_s=ENGINE_TIMEOUT_S)
    try:
        async def complete_all() -> list[Any]:
            async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0,
                                   timeout=300) as api:
                return await asyncio.gather(*(api.completions.create(
                    model=str(tiny_llama), prompt=p, max_tokens=MAX_TOKENS, temperature=0.0,
                    extra_body={"ignore_eos": True, "return_token_ids": True}) for p in PROMPTS))

        answers = asyncio.run(complete_all())
        prompt_ids = [a.choices[0].prompt_token_ids for a in answers]
        assert [a.choices[0].token_ids for a in answers] == hf_greedy(tiny_llama, prompt_ids, MAX_TOKENS)
        import json
        import urllib.request

        request = urllib.request.Request(f"{server.base_url}{REPORT_PATH}",
                                         headers={"Authorization": f"Bearer {API_KEY}"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            report = json.loads(answer.read())
        check_tp_ranks(report["ranks"])
        check_workers_on_both_nodes(ray_cluster, before)
        kill_a_ray_worker_mid_load(server, str(tiny_llama))
    finally:
        server.stop()
    # the next test's engine, a fresh TP=2 group on the same cluster, serves again: the killed worker's bundle
    # went back to Ray


def test_generate_tp2_on_ray_equals_transformers(ray_cluster, tiny_llama):
    """``generate --engine-arg distributed_executor_backend=ray`` at TP=2 (the engine is the Ray driver).

    It runs after the serve test killed a Ray worker there: its placement group takes a bundle on each node again
    (the cluster recovered), which is the restart after the fault."""
    env = ray_env(RAY_ADDRESS=ray_cluster["address"])
    before = [kernel_workers(d) for d in ray_cluster["temp_dirs"]]
    args = ["generate", "--json", "--model", str(tiny_llama), "--max-tokens", str(MAX_TOKENS),
            "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "distributed_executor_backend=ray"]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    proc = run_cli(args, env=env)
    run = json.loads(proc.stdout)  # the document alone: Ray's worker log lines went to stderr, also the late ones
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert tokens(run) == hf_greedy(tiny_llama, prompt_ids, MAX_TOKENS)
    check_tp_ranks(run["report"]["ranks"])
    check_workers_on_both_nodes(ray_cluster, before)
    changes = {c["path"]: c for c in run["report"]["config_changes"]}
    executor = changes["parallel_config.distributed_executor_backend"]
    assert "KernelCpuRayExecutor" in executor["new"] and executor["plugin"] == "platform"


def ray_worker_pids() -> list[int]:
    """The kernel's Ray worker actors on this host (Ray titles an actor's process after its class)."""
    found = subprocess.run(["pgrep", "-f", "KernelCpuRayWorkerProc"], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def kill_a_ray_worker_mid_load(server: LocalServer, model: str) -> None:
    """SIGKILL one TP worker while four streams run and four wait: every open request fails in bounded time
    (vLLM's engine core sees the actor die), /health stops saying 200, and the server does not run on."""
    from tests.e2e import faults

    pids = ray_worker_pids()
    assert len(pids) >= 2, pids

    victim = pids[-1]  # one worker's process only: its process group is its Ray node's
    killed_at, outcomes = asyncio.run(faults.kill_mid_load(server, lambda: os.kill(victim, signal.SIGKILL), model,
                                                           API_KEY, running=4))  # --max-num-seqs 4: 4 queued
    ended = max(t for _, _, t in outcomes) - killed_at
    failed = [detail for kind, detail, _ in outcomes if kind == "error"]
    # TP: every request open at the kill (four running, four queued) needs both ranks: all fail
    assert failed and all(kind == "error" for kind, _, t in outcomes if t > killed_at), outcomes
    assert ended < faults.BOUND_S, outcomes
    answers = []
    while server.process.poll() is None and time.monotonic() - killed_at < faults.BOUND_S:
        answers.append(faults.health(server))
        time.sleep(0.25)
    assert 200 not in answers and set(answers) <= {503, "refused"}, answers
    assert server.process.poll() is not None, "the server still runs after its Ray worker died"
    print(f"\n[ray worker fault] {len(failed)}/{len(outcomes)} requests failed, all within {ended:.1f} s of the "
          f"kill; server exited after {time.monotonic() - killed_at:.1f} s; /health {sorted(map(str, set(answers)))}")

"""``ascend-kernel serve-pd MODEL --prefill N --decode N``: a disaggregated deployment on this host.

Starts N ``ascend-kernel serve`` instances as ``kv_producer`` and N as
``kv_consumer`` (vLLM's ``MooncakeConnector``, ``--mooncake-protocol``, TCP
by default), each on a free loopback port with its own log file, each
producer with a bootstrap port of its own (``VLLM_MOONCAKE_BOOTSTRAP_PORT``),
waits until every one answers ``/health``, then runs ``ascend-kernel
pd-proxy`` in front of them on ``--host``/``--port`` until interrupted, and
stops the instances when it ends. Every argument it does not know is passed
to every instance (vLLM serve arguments: ``--dtype``, ``--max-model-len``,
``--api-key``, ...). ``GET /pd-proxy/status`` on the proxy lists the
instances' URLs (their ``/ascend-kernel/report`` counts the pages moved).

On a CPU host without ``VLLM_CPU_OMP_THREADS_BIND`` set, instance i is bound
to core ``i mod cores`` (vLLM's automatic binding would put every instance on
the same cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

PROG = "ascend-kernel serve-pd"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="prefill (kv_producer) and decode (kv_consumer) instances of ascend-kernel serve "
        "over vLLM's MooncakeConnector, and the pd-proxy in front of them; other arguments go to every instance")
    parser.add_argument("model")
    parser.add_argument("--prefill", type=_positive, default=1, help="prefill instances (default 1)")
    parser.add_argument("--decode", type=_positive, default=1, help="decode instances (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="the proxy's address (default %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="the proxy's port (default %(default)s)")
    parser.add_argument("--prefill-tp", type=_positive, default=1,
                        help="tensor-parallel size of each prefill instance (default 1)")
    parser.add_argument("--decode-tp", type=_positive, default=1,
                        help="tensor-parallel size of each decode instance (default 1; may differ from the "
                        "prefill's: the connector maps KV heads between the two layouts)")
    parser.add_argument("--mooncake-protocol", default="tcp", help="transfer protocol: tcp (default), rdma (needs "
                        "RDMA NICs) or ascend (between Ascend NPUs)")
    parser.add_argument("--log-dir", type=Path, default=None, help="instance logs (default: a new temporary folder)")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    return parser


def _positive(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a whole number >= 1")
    return value


def kv_transfer_config(role: str, protocol: str) -> str:
    return json.dumps({"kv_connector": "MooncakeConnector", "kv_role": role,
                       "kv_connector_extra_config": {"mooncake_protocol": protocol}})


def instance_env(first_core: int, bootstrap_port: int | None, tp: int = 1) -> dict[str, str]:
    """An instance's environment: its bootstrap port (producers) and, on a CPU host, one core per TP rank.

    Instances take the host's cores in turn from ``first_core`` (wrapping
    around when there are fewer cores than ranks: they then share), written
    as vLLM-CPU's per-rank binding ``"a|b"``.
    """
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # a server's engine core always runs apart
    if bootstrap_port is not None:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if "VLLM_CPU_OMP_THREADS_BIND" not in env and cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(cores[(first_core + r) % len(cores)]) for r in range(tp))
    return env


def build_instances(args: argparse.Namespace, serve_args: list[str], log_dir: Path) -> list[Any]:
    """LocalServers for every instance, producers first (not started)."""
    from ascend_kernel.cli.serving import LocalServer, free_port

    cli = [sys.executable, "-m", "ascend_kernel.cli.main", "serve", args.model, *serve_args]
    api_key = _option_value(serve_args, "--api-key")
    servers = []
    first_core = 0
    for index in range(args.prefill + args.decode):
        producer = index < args.prefill
        role = "kv_producer" if producer else "kv_consumer"
        name = f"prefill{index}" if producer else f"decode{index - args.prefill}"
        tp = args.prefill_tp if producer else args.decode_tp
        env = instance_env(first_core, free_port() if producer else None, tp)
        first_core += tp
        argv = [*cli, "--kv-transfer-config", kv_transfer_config(role, args.mooncake_protocol)]
        if tp > 1:
            argv += ["--tensor-parallel-size", str(tp)]
        servers.append(LocalServer(argv, env, log_dir / f"{name}.log", api_key=api_key, new_session=False))
    return servers


def _option_value(argv: list[str], option: str) -> str | None:
    for i, word in enumerate(argv):
        if word == option and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str]) -> int:
    from ascend_kernel.cli.pd_proxy import serve_proxy
    from ascend_kernel.cli.value_checks import check_value
    from ascend_kernel.errors import KernelError

    args, serve_args = build_parser().parse_known_args(list(argv))
    if any(a.split("=", 1)[0].replace("_", "-") == "--kv-transfer-config" for a in serve_args):
        print(f"{PROG}: error: --kv-transfer-config is set by {PROG} (one kv_producer or kv_consumer config per "
              "instance); leave it out (--mooncake-protocol chooses the transport)", file=sys.stderr)
        return 2
    if any(a.split("=", 1)[0].replace("_", "-") in ("--tensor-parallel-size", "-tp") for a in serve_args):
        print(f"{PROG}: error: --tensor-parallel-size is set per role by {PROG}; use --prefill-tp and --decode-tp "
              "(whole numbers >= 1); nothing was started", file=sys.stderr)
        return 2
    try:  # the kv-transfer plugin's check (cli/value_checks.py)
        check_value("mooncake_protocol", args.mooncake_protocol, "--mooncake-protocol")
    except KernelError as exc:  # the check's UsageError, or a bad ASCEND_KERNEL_* setting
        print(f"{PROG}: error: {exc}; nothing was started", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="ascend-kernel-pd-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = build_instances(args, serve_args, log_dir)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(timeout_s=args.startup_timeout), servers))
        for server in servers:
            print(f"{PROG}: {server.log_path.stem} at {server.base_url} (log {server.log_path})", file=sys.stderr)
        signal.signal(signal.SIGTERM, previous)
        prefill = [s.base_url for s in servers[:args.prefill]]
        decode = [s.base_url for s in servers[args.prefill:]]
        serve_proxy(prefill, decode, args.host, args.port)  # timeouts: the ASCEND_KERNEL_PD_PROXY_* settings
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:  # an instance died or hung at start-up: its log tail is in exc
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers))
    return 0

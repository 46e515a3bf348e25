"""Decode step time of cpu-graph (piecewise and full_decode_only) vs the kernel's eager mode vs stock vLLM-CPU
compiled, in one run.

Engines (``--engines``, default all): ``eager`` (the kernel, enforce_eager), ``cpu-graph`` (piecewise),
``cpu-graph-full`` (full_decode_only: uniform decode batches replay the whole model, vLLM's CPU
attention inside as an opaque op), ``stock-compiled`` (vLLM-CPU's default compilation, no kernel). Each in its own process (vLLM fixes its platform per process),
started one after another so each start-up is timed alone (``startup_s``:
building ``LLM``, which includes cpu-graph's capture). Then rounds: in every
round each engine, in an order rotated per round, runs one block per batch
size. A block is two greedy generations of ``batch`` copies of one prompt:
``--tokens`` tokens and 1 token (the prefill alone); their difference is the
decode time, so ``decode_tok_s = batch * (tokens - 1) / (t_long - t_short)``.
Per engine and batch the median over rounds is reported as the decode step
time, with its ratios against eager and stock-compiled (above 1: faster) and
the range of the per-round paired ratios (each round runs every engine once,
so a ratio within a round compares runs made seconds apart). Every block's
tokens must equal the other engines' (greedy, same model), or the run fails.
``--json`` prints a list of rows ``{"model", "batch", "mode", "step_ms",
"vs_eager", "vs_stock_compiled", ...}``.

    nice -n 10 .venv/bin/python bench/graph.py --model /tmp/llama [--sizes 1,2,4] [--batches 1,8,32] [--json]

Honest limits: a shared 2-core VM; processes differ in memory placement by a
few per cent (see bench/step_overhead.py), which one launch does not average out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from engine_pipe import EnginePipe

PROMPT = "The quick brown fox jumps over the lazy dog while the"
ENGINES = ("eager", "cpu-graph", "cpu-graph-full", "stock-compiled")


# -- inside each engine process ------------------------------------------------------------------------


def _engine(name: str, model: str, sizes: list[int]) -> Any:
    from ascend_kernel.cli import engine

    kernel = name != "stock-compiled"
    engine.prepare_process(kernel=kernel)
    extra: dict[str, Any] = {}
    if name.startswith("cpu-graph"):
        section = {"graph_mode": "cpu-graph", "graph_capture_sizes": sizes}
        if name == "cpu-graph-full":
            section.update(graph_capture_mode="full_decode_only")
        extra["additional_config"] = {"ascend_kernel": section}
    request = engine.EngineRequest(model=model, kernel=kernel, enforce_eager=name == "eager", extra=extra)
    return engine.build_llm(request)


def worker(name: str, model: str, sizes: list[int]) -> None:
    """Build the engine, say how long it took, then answer one block per request line."""
    import contextlib
    import os

    out = sys.stdout
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        llm = _engine(name, model, sizes)
        from vllm import SamplingParams
    startup_s = time.perf_counter() - started
    report = None
    if name != "stock-compiled":
        report = llm.collective_rpc("ascend_kernel_report")[0].get("graph")
    out.write(json.dumps({"startup_s": startup_s, "graph": report, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        batch, tokens = request["batch"], request["tokens"]
        prompts = [PROMPT] * batch
        times = {}
        ids = None
        with contextlib.redirect_stdout(sys.stderr):
            for n in (tokens, 1):
                params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                t0 = time.perf_counter()
                result = llm.generate(prompts, params, use_tqdm=False)
                times[n] = time.perf_counter() - t0
                if n == tokens:
                    ids = [list(o.outputs[0].token_ids) for o in result]
        decode_s = times[tokens] - times[1]
        out.write(json.dumps({"decode_s": decode_s, "tok_s": batch * (tokens - 1) / decode_s, "ids": ids}) + "\n")
        out.flush()


# -- the driver ----------------------------------------------------------------------------------------


class Engine(EnginePipe):
    def __init__(self, name: str, model: str, sizes: list[int]) -> None:
        self.name = name
        super().__init__(__file__, name, [name, "--model", model, "--sizes", ",".join(map(str, sizes))])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--sizes", default="1,2,4", help="cpu-graph's capture sizes")
    p.add_argument("--batches", default="1,3", help="decode batch sizes to time")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--engines", default=",".join(ENGINES), help="which engines to run (eager and "
                   "stock-compiled are always run: they are the baselines)")
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(args.worker, args.model, sizes)
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    wanted = set(args.engines.split(",")) | {"eager", "stock-compiled"}
    unknown = wanted - set(ENGINES)
    if unknown:
        p.error(f"--engines: unknown {sorted(unknown)}; allowed: {', '.join(ENGINES)}")
    engines = [Engine(name, args.model, sizes) for name in ENGINES if name in wanted]
    names = [e.name for e in engines]
    samples: dict[tuple[str, int], list[float]] = {(e.name, b): [] for e in engines for b in batches}
    try:
        for r in range(args.rounds):
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for batch in batches:
                ids = {}
                for e in order:
                    block = e.block(batch, args.tokens)
                    samples[(e.name, batch)].append(block["decode_s"] / (args.tokens - 1))
                    ids[e.name] = block["ids"]
                if len({json.dumps(v) for v in ids.values()}) != 1:
                    raise SystemExit(f"tokens differ between engines at batch {batch}: {ids}")
    finally:
        for e in engines:
            e.close()
    rows = []
    for batch in batches:
        for e in engines:
            step = samples[(e.name, batch)]
            row: dict[str, Any] = {"model": args.model, "batch": batch, "mode": e.name,
                                   "step_ms": round(1000 * statistics.median(step), 3),
                                   "startup_s": round(e.hello["startup_s"], 2)}
            for base, key in (("eager", "vs_eager"), ("stock-compiled", "vs_stock_compiled")):
                ref = samples[(base, batch)]
                paired = sorted(b / a for a, b in zip(step, ref))  # per round: baseline time / this time
                row[key] = round(statistics.median(ref) / statistics.median(step), 3)
                row[key + "_range"] = [round(paired[0], 3), round(paired[-1], 3)]
            if e.hello["graph"]:
                row["capture_s"] = e.hello["graph"].get("capture_s")
                row["replays"] = e.hello["graph"].get("replays")
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'batch':>5} {'mode':>15} {'step ms':>8} {'vs eager':>16} {'vs stock compiled':>18} {'start-up s':>10}")
    for row in rows:
        print(f"{row['batch']:>5} {row['mode']:>15} {row['step_ms']:>8} "
              f"{row['vs_eager']:>6} {str(row['vs_eager_range']):>9} {row['vs_stock_compiled']:>6} "
              f"{str(row['vs_stock_compiled_range']):>11} {row['startup_s']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fusion passes on and off, per compile path: seam-op calls per decode step and decode tok/s, in one run.

Engines (each in its own process; the seam's layers on, ``layer_ops=ascend``,
so the graphs hold the seam ops the passes match): for each compile path,
``compiled`` (vLLM-CPU's default compilation: Dynamo once, then inductor) and
``cpu-graph`` (the kernel's per-size artifacts, piecewise), one engine with
every fusion pass set on (explicitly: muls-add stands down on a CPU host by default) and one with them all forced off
(``fuse_norm_quant/fuse_qknorm_rope/fuse_muls_add=false``). Rounds as in
bench/graph.py: each engine runs blocks of two greedy generations (``--tokens``
and 1 token) per batch size; the difference is the decode time. Seam-op calls
are counted where a registered seam op runs its body (what a compiled graph
calls), over the same two generations, so ``seam_calls_per_step`` is per decode
step of the whole batch. Tokens must be equal across engines, or the run fails.
``--json`` prints rows ``{"model", "path", "batch", "fused", "tok_s", "seam_calls_per_step",
"fused_vs_unfused", "matches"}``.

    nice -n 10 .venv/bin/python bench/fusion.py --model /tmp/qwen3_moe [--batches 1,8] [--json]

Honest limits: a shared 2-core VM; one launch does not average out process placement. The workers wait
passively (``OMP_WAIT_POLICY=PASSIVE`` unless set), so the idle engine does not spin on the cores.
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
PATHS = ("compiled", "cpu-graph")
OFF = {"fuse_norm_quant": False, "fuse_qknorm_rope": False, "fuse_muls_add": False}
#: every pass set on explicitly (muls-add stands down on a CPU host unless set: this measures it there too)
ON = {name: True for name in OFF}


def _count_seam_calls() -> dict[str, int]:
    """Count every registered seam op's body run (the ops a compiled graph calls), by op name."""
    from ascend_kernel.ops import opaque

    counts: dict[str, int] = {}
    find = opaque._eager_body

    def counted(owner_cls: type, op_name: str) -> Any:
        body = find(owner_cls, op_name)

        def run(*args: Any) -> Any:
            counts[op_name] = counts.get(op_name, 0) + 1
            return body(*args)
        return run

    opaque._eager_body = counted  # the registered ops look it up per call
    return counts


#: inductor compiles every graph in each worker: a graph served from its FX graph cache skips the passes, and
#: its matches would not be counted (this benchmark's own worker processes only)
COMPILE_EVERY_GRAPH = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def worker(path: str, fused: bool, model: str, sizes: list[int]) -> None:
    import contextlib
    import os

    os.environ.update(COMPILE_EVERY_GRAPH)  # before torch reads its inductor config
    # the two engines live side by side: an idle one's OpenMP threads spinning would take the cores of the one
    # timed (0.38x to 23x swings on this 2-core host); passive waiting lets them sleep (before libgomp starts)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        from ascend_kernel.cli import engine

        engine.prepare_process(kernel=True)
        section: dict[str, Any] = {"layer_ops": "ascend", **(ON if fused else OFF)}
        if path == "cpu-graph":
            section.update(graph_mode="cpu-graph", graph_capture_sizes=sizes)
        request = engine.EngineRequest(model=model, kernel=True, enforce_eager=False,
                                       extra={"additional_config": {"ascend_kernel": section}})
        started = time.perf_counter()
        llm = engine.build_llm(request)
        startup_s = time.perf_counter() - started
        from vllm import SamplingParams
        counts = _count_seam_calls()
    report = llm.collective_rpc("ascend_kernel_report")[0]
    out.write(json.dumps({"startup_s": startup_s, "fusion": report.get("fusion")}) + "\n")
    out.flush()
    for line in sys.stdin:
        request_ = json.loads(line)
        batch, tokens = request_["batch"], request_["tokens"]
        times, calls, ids = {}, {}, None
        with contextlib.redirect_stdout(sys.stderr):
            for n in (tokens, 1):
                params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                before = sum(counts.values())
                t0 = time.perf_counter()
                result = llm.generate([PROMPT] * batch, params, use_tqdm=False)
                times[n] = time.perf_counter() - t0
                calls[n] = sum(counts.values()) - before
                if n == tokens:
                    ids = [list(o.outputs[0].token_ids) for o in result]
        decode_s = times[tokens] - times[1]
        out.write(json.dumps({"decode_s": decode_s, "calls_per_step": (calls[tokens] - calls[1]) / (tokens - 1),
                              "ids": ids}) + "\n")
        out.flush()


def muls_add_micro(batches: list[int], rounds: int = 20, calls: int = 500) -> list[dict[str, Any]]:
    """Inductor's ``linear(x * 2.0 + y, w)`` against ``linear(muls_add(x, y, 2.0), w)`` in this process (one
    thread, interleaved rounds): what the muls-add pass costs or saves on this host, without engine noise."""
    import torch

    from ascend_kernel.ops import get_ops

    ops = get_ops("reference", "cpu")
    torch.set_num_threads(1)
    fns = {"unfused": lambda x, y, w: torch.nn.functional.linear(x * 2.0 + y, w),
           "fused": lambda x, y, w: torch.nn.functional.linear(ops.muls_add(x, y, 2.0), w)}
    rows = []
    for batch in batches:
        args = (torch.randn(batch, 512), torch.randn(batch, 512), torch.randn(512, 512))
        compiled = {k: torch.compile(f, fullgraph=True) for k, f in fns.items()}
        for f in compiled.values():
            f(*args)
        times: dict[str, list[float]] = {k: [] for k in compiled}
        for r in range(rounds):
            for k, f in (list(compiled.items()) if r % 2 == 0 else list(compiled.items())[::-1]):
                t0 = time.perf_counter()
                for _ in range(calls):
                    f(*args)
                times[k].append((time.perf_counter() - t0) / calls * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"micro": "muls_add", "batch": batch, "unfused_us": round(med["unfused"], 1),
                     "fused_us": round(med["fused"], 1), "fused_vs_unfused": round(med["unfused"] / med["fused"], 3)})
    return rows


class Engine(EnginePipe):
    def __init__(self, path: str, fused: bool, model: str, sizes: list[int]) -> None:
        self.path, self.fused = path, fused
        super().__init__(__file__, f"{path} fused={fused}",
                         [path, "--fused", str(int(fused)), "--model", model, "--sizes", ",".join(map(str, sizes))])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="the model the engines serve (required unless --muls-add-micro)")
    p.add_argument("--muls-add-micro", action="store_true",
                   help="only time inductor's x * 2.0 + y against the muls_add op in this process (no engine)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"compile paths to run ({', '.join(PATHS)})")
    p.add_argument("--sizes", default="1,8", help="cpu-graph's capture sizes")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--fused", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(args.worker, bool(args.fused), args.model, sizes)
        return 0
    paths = args.paths.split(",")
    unknown = set(paths) - set(PATHS)
    if unknown:
        p.error(f"--paths: unknown {sorted(unknown)}; allowed: {', '.join(PATHS)}")
    batches = [int(b) for b in args.batches.split(",")]
    if args.muls_add_micro:
        micro = muls_add_micro(batches)
        print(json.dumps(micro, indent=2) if args.json else "\n".join(
            f"muls_add batch {r['batch']}: unfused {r['unfused_us']} us, fused {r['fused_us']} us, "
            f"fused vs unfused {r['fused_vs_unfused']}x" for r in micro))
        return 0
    if not args.model:
        p.error("--model is required (or --muls-add-micro)")
    rows = []
    for path in paths:
        engines = [Engine(path, fused, args.model, sizes) for fused in (True, False)]
        steps: dict[tuple[bool, int], list[float]] = {(e.fused, b): [] for e in engines for b in batches}
        calls: dict[tuple[bool, int], float] = {}
        try:
            for r in range(args.rounds):
                for batch in batches:
                    ids = {}
                    for e in (engines if r % 2 == 0 else engines[::-1]):
                        block = e.block(batch, args.tokens)
                        steps[(e.fused, batch)].append(block["decode_s"] / (args.tokens - 1))
                        calls[(e.fused, batch)] = block["calls_per_step"]
                        ids[e.fused] = block["ids"]
                    if ids[True] != ids[False]:
                        raise SystemExit(f"{path}: fused tokens differ from unfused at batch {batch}")
        finally:
            for e in engines:
                e.close()
        for batch in batches:
            for e in engines:
                step = statistics.median(steps[(e.fused, batch)])
                rows.append({"model": args.model, "path": path, "batch": batch, "fused": e.fused,
                             "tok_s": round(batch / step, 1), "step_ms": round(1000 * step, 3),
                             "seam_calls_per_step": calls[(e.fused, batch)],
                             "fused_vs_unfused": round(statistics.median(steps[(False, batch)]) / step, 3),
                             "matches": {f["name"]: f["matches"] for f in e.hello["fusion"] or []},
                             "startup_s": round(e.hello["startup_s"], 1)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'path':>10} {'batch':>5} {'fused':>5} {'tok/s':>8} {'seam calls/step':>15} {'vs unfused':>10}  matches")
    for row in rows:
        print(f"{row['path']:>10} {row['batch']:>5} {str(row['fused']):>5} {row['tok_s']:>8} "
              f"{row['seam_calls_per_step']:>15} {row['fused_vs_unfused']:>10}  {row['matches']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

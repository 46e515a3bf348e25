"""Prefill throughput at TP=2: sequence parallelism (FlashComm v1) vs all-reduce, and the bytes each rank sends.

One run, two engines alive at once (each in a child process of its own: vLLM fixes its platform per process),
both TP=2 (``VLLM_CPU_OMP_THREADS_BIND="0|1"``: vLLM-CPU's shared-memory collectives), the seam's layers and
``ASCEND_KERNEL_SEQUENCE_PARALLEL=1`` on a tiny Llama widened to ``--hidden`` with prompts of ``--prompt-tokens``
tokens:

* ``sequence-parallel``: the default threshold (1,000 tokens), so every prefill pass runs sequence parallel;
* ``all-reduce``: the threshold above any pass, so the same layers and the same opaque op all-reduce.

Both go through ``ascend_kernel::tp_add_rms_norm``, so both count the bytes each rank sent
(``tp_comm_bytes_sent`` in the step trace, ring-algorithm bytes) and the op's calls by choice. After a warm-up
each engine times ``--rounds`` greedy generations of ``--batch`` prompts with one output token (the prefill
alone); the rounds are interleaved (SP, AR, AR, SP, ...: the idle engine's workers sleep), so both see the same
host load, which on a shared host moves more than the difference measured. ``vs_all_reduce`` is the median of the
rounds' paired ratios (all-reduce's round time over sequence parallel's: above 1, SP is faster);
``prefill_tok_s`` per engine is from its median round.

    nice -n 10 .venv/bin/python bench/sp.py [--rounds 15] [--batch 1] [--prompt-tokens 2048] [--compiled] [--json]

Honest limits: a shared 2-core host, where two TP ranks compete with everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = {"sequence-parallel": None, "all-reduce": 10**9}  # the sp_min_tokens each engine runs under
MARK = "@@bench-sp "  # the child's protocol lines, among whatever else reaches its stdout


def _child(mode: str, model: str, args: argparse.Namespace) -> None:
    """One engine: ``ready`` after its warm-up, one timed round per ``round`` line on stdin, its counters on ``done``."""
    import contextlib

    out = sys.stdout

    def say(record: dict[str, Any]) -> None:
        out.write(MARK + json.dumps(record) + "\n")
        out.flush()

    with contextlib.redirect_stdout(sys.stderr):
        from ascend_kernel.cli import engine

        engine.prepare_process(kernel=True)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        max_len = args.prompt_tokens + 16
        request = engine.EngineRequest(model=model, enforce_eager=not args.compiled, max_model_len=max_len, extra={
            "tensor_parallel_size": 2, "max_num_batched_tokens": max_len * args.batch,
            "max_num_seqs": max(args.batch, 2)})
        llm = engine.build_llm(request)
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

        def prompts(seed: int) -> list[Any]:
            return [TokensPrompt(prompt_token_ids=[(seed * 7919 + b * 104729 + i * 31) % 500 + 10
                                                   for i in range(args.prompt_tokens)]) for b in range(args.batch)]

        def traces() -> list[dict[str, Any]]:
            report = engine.kernel_report(llm)
            return [r["trace"] for r in report["ranks"]]

        llm.generate(prompts(0), params, use_tqdm=False)  # warm-up (and the compile, if any)
        before = traces()
        say({"ready": mode})
        rounds = 0
        for line in sys.stdin:
            if line.strip() != "round":
                break
            rounds += 1
            started = time.perf_counter()
            llm.generate(prompts(rounds), params, use_tqdm=False)  # the same prompts in both engines
            say({"round_s": time.perf_counter() - started})
        after = traces()
    steps = after[0]["steps"] - before[0]["steps"]
    sent, calls = [], {}
    for b, a in zip(before, after):
        total = {k: a.get("tp_comm_bytes_sent", {}).get(k, 0) - b.get("tp_comm_bytes_sent", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
        sent.append(sum(total.values()) / max(steps, 1))
        calls = {k: a.get("sequence_parallel_norm_ops", {}).get(k, 0) - b.get("sequence_parallel_norm_ops", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
    say({"mode": mode, "steps": steps, "bytes_sent_per_rank_per_step": sent, "norm_op_calls": calls})


class _Engine:
    """A child engine driven line by line (its vLLM logs go to a file, read back only if it fails)."""

    def __init__(self, mode: str, model: Path, args: argparse.Namespace, log_dir: Path) -> None:
        env = dict(os.environ, ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend",
                   ASCEND_KERNEL_SEQUENCE_PARALLEL="1", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_CPU_KVCACHE_SPACE="1",
                   OMP_WAIT_POLICY="PASSIVE")
        env.pop("ASCEND_KERNEL_SP_MIN_TOKENS", None)
        if MODES[mode] is not None:
            env["ASCEND_KERNEL_SP_MIN_TOKENS"] = str(MODES[mode])
        argv = [sys.executable, __file__, "--child", mode, "--model", str(model), "--batch", str(args.batch),
                "--prompt-tokens", str(args.prompt_tokens)] + (["--compiled"] if args.compiled else [])
        self.mode = mode
        self.log = log_dir / f"{mode}.log"
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), text=True, cwd=Path(__file__).resolve().parents[1])

    def read(self) -> dict[str, Any]:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.proc.wait()
        raise SystemExit(f"engine {self.mode} stopped (rc {self.proc.returncode}):\n{self.log.read_text()[-3000:]}")

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def finish(self) -> dict[str, Any]:
        self.send("done")
        result = self.read()
        self.proc.wait()
        return result


def _measure(model: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ak-bench-sp-") as logs:
        engines: dict[str, _Engine] = {}
        try:
            for mode in MODES:  # one start-up at a time: each compiles and warms up alone
                engines[mode] = _Engine(mode, model, args, Path(logs))
                engines[mode].read()
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for r in range(args.rounds):
                for mode in (list(MODES) if r % 2 == 0 else list(reversed(MODES))):
                    engines[mode].send("round")
                    times[mode].append(engines[mode].read()["round_s"])
            rows = {mode: engine.finish() for mode, engine in engines.items()}
        finally:
            for engine in engines.values():
                if engine.proc.poll() is None:
                    engine.proc.kill()
    for mode, row in rows.items():
        row["round_s"] = times[mode]
        row["prefill_tok_s"] = args.batch * args.prompt_tokens / statistics.median(times[mode])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--compiled", action="store_true", help="vLLM-CPU's default compilation instead of eager")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child")
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.model, args)
        return
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("llama", Path(tempfile.gettempdir()) / f"ak-bench-sp-llama-{args.hidden}", seed=0,
                              overrides={"hidden_size": args.hidden, "intermediate_size": 2 * args.hidden,
                                         "max_position_embeddings": args.prompt_tokens + 64})
    rows = _measure(model, args)
    sp, ar = rows["sequence-parallel"], rows["all-reduce"]
    if sp["norm_op_calls"]["sequence_parallel"] == 0 or ar["norm_op_calls"]["sequence_parallel"] != 0:
        raise SystemExit(f"the engines did not run the choices they were set up for: {sp['norm_op_calls']}, "
                         f"{ar['norm_op_calls']}")
    result = {"prompt_tokens": args.prompt_tokens, "batch": args.batch, "hidden_size": args.hidden, "tp": 2,
              "compiled": args.compiled, "engines": rows,
              "vs_all_reduce": statistics.median(a / s for a, s in zip(ar["round_s"], sp["round_s"]))}
    if args.json:
        print(json.dumps(result))
        return
    for mode, row in rows.items():
        print(f"{mode:18s} prefill {row['prefill_tok_s']:9.0f} tok/s   sent per rank per step "
              f"{[round(b / 1e6, 2) for b in row['bytes_sent_per_rank_per_step']]} MB")
    print(f"sequence parallel vs all-reduce: {result['vs_all_reduce']:.2f}x")


if __name__ == "__main__":
    main()

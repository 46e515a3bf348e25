"""Prefill throughput at TP=2: sequence parallelism (FlashComm v1) vs all-reduce, and the bytes each rank sends.

One engine, TP=2 (``VLLM_CPU_OMP_THREADS_BIND="0|1"``: vLLM-CPU's shared-memory collectives), the seam's layers
and ``ASCEND_KERNEL_SEQUENCE_PARALLEL=1``, on a tiny Llama widened to ``--hidden`` with prompts of
``--prompt-tokens`` tokens. The TP-communication policy chooses per pass at run time, from its threshold; the
benchmark moves that threshold on every rank between rounds (``collective_rpc``), so both choices run in the same
processes, on the same memory and the same prompts:

* ``sequence-parallel``: threshold 1 (every prefill pass runs sequence parallel);
* ``all-reduce``: a threshold above any pass (the same layers and the same opaque op all-reduce).

Both go through ``ascend_kernel::tp_add_rms_norm``, so both count the bytes each rank sent
(``tp_comm_bytes_sent`` in the step trace, ring-algorithm bytes) and the op's calls by choice. After a warm-up of
each, ``--rounds`` rounds each time one greedy generation of ``--batch`` prompts with one output token (the
prefill alone) per choice, in alternating order (SP, AR, AR, SP, ...). ``vs_all_reduce`` is the median of the
rounds' paired ratios (all-reduce's round time over sequence parallel's: above 1, SP is faster);
``prefill_tok_s`` per choice is from its median round. Two engines, one per choice, differed by up to 6 % with
the same choice on this host (process placement): hence one engine.

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

MODES = {"sequence-parallel": 1, "all-reduce": 10**9}  # the policy's threshold for each choice
MARK = "@@bench-sp "  # the child's protocol lines, among whatever else reaches its stdout


def _set_threshold(worker: Any, min_tokens: int) -> int:
    """On a worker: the TP-communication policy's threshold (a kernel object's field; the benchmark's lever)."""
    from ascend_kernel import kernel as kernel_mod

    policy = kernel_mod.current_or_none().plan.tp_comm  # type: ignore[union-attr]
    policy.min_tokens = min_tokens
    return policy.min_tokens


def _child(model: str, args: argparse.Namespace) -> None:
    import contextlib

    out = sys.stdout
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
            return [r["trace"] for r in engine.kernel_report(llm)["ranks"]]

        def run(mode: str, seed: int) -> float:
            assert set(llm.collective_rpc(_set_threshold, args=(MODES[mode],))) == {MODES[mode]}
            started = time.perf_counter()
            llm.generate(prompts(seed), params, use_tqdm=False)
            return time.perf_counter() - started

        seeds = iter(range(1, 10**6))  # a prompt never seen before in every generation: no prefix-cache hit
        for mode in MODES:
            run(mode, next(seeds))  # warm-up (and the compile, if any)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        counters = {}
        for mode in MODES:  # each choice's counters over one round of its own
            before = traces()
            run(mode, next(seeds))
            after = traces()
            counters[mode] = _counters(before, after)
        for r in range(args.rounds):
            for mode in (list(MODES) if r % 2 == 0 else list(reversed(MODES))):
                times[mode].append(run(mode, next(seeds)))
    rows = {}
    for mode in MODES:
        rows[mode] = dict(counters[mode], round_s=times[mode],
                          prefill_tok_s=args.batch * args.prompt_tokens / statistics.median(times[mode]))
    out.write(MARK + json.dumps(rows) + "\n")
    out.flush()


def _counters(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    steps = after[0]["steps"] - before[0]["steps"]
    sent, calls = [], {}
    for b, a in zip(before, after):
        total = {k: a.get("tp_comm_bytes_sent", {}).get(k, 0) - b.get("tp_comm_bytes_sent", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
        sent.append(sum(total.values()) / max(steps, 1))
        calls = {k: a.get("sequence_parallel_norm_ops", {}).get(k, 0) - b.get("sequence_parallel_norm_ops", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
    return {"steps": steps, "bytes_sent_per_rank_per_step": sent, "norm_op_calls": calls}


def _measure(model: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env = dict(os.environ, ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend",
               ASCEND_KERNEL_SEQUENCE_PARALLEL="1", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_CPU_KVCACHE_SPACE="1",
               OMP_WAIT_POLICY="PASSIVE", VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # collective_rpc with a function
    env.pop("ASCEND_KERNEL_SP_MIN_TOKENS", None)
    argv = [sys.executable, __file__, "--child", "--model", str(model), "--rounds", str(args.rounds),
            "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens)]
    if args.compiled:
        argv.append("--compiled")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    rows = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]  # vLLM may print on exit
    if proc.returncode != 0 or not rows:
        raise SystemExit(f"the engine failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(rows[-1][len(MARK):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--compiled", action="store_true", help="vLLM-CPU's default compilation instead of eager")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        _child(args.model, args)
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

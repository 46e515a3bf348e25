"""Prefill throughput at TP=2: sequence parallelism (FlashComm v1) vs all-reduce, and the bytes each rank sends.

One run, two engines one after the other (each in a child process of its own: vLLM fixes its platform per
process), both TP=2 over gloo (``VLLM_CPU_OMP_THREADS_BIND="0|1"``), the seam's layers and
``ASCEND_KERNEL_SEQUENCE_PARALLEL=1`` on a tiny Llama widened to ``--hidden`` with prompts of ``--prompt-tokens``
tokens:

* ``sequence-parallel``: the default threshold (1,000 tokens), so every prefill pass runs sequence parallel;
* ``all-reduce``: the threshold above any pass, so the same layers and the same opaque op all-reduce.

Both go through ``ascend_kernel::tp_add_rms_norm``, so both count the bytes each rank sent
(``tp_comm_bytes_sent`` in the step trace, ring-algorithm bytes) and the op's calls by choice. Each engine times
``--rounds`` greedy generations of ``--batch`` prompts with one output token (the prefill alone) after a warm-up;
the median gives ``prefill_tok_s``; ``vs_all_reduce`` is sequence parallel's over all-reduce's (above 1: faster).

    nice -n 10 .venv/bin/python bench/sp.py [--rounds 5] [--batch 1] [--prompt-tokens 2048] [--compiled] [--json]

Honest limits: a shared 2-core host, where two TP ranks and their gloo collectives compete with everything else
(and vLLM-CPU's all-reduce may use its shared-memory path while the reduce-scatter runs on gloo); the engines run
one after the other, not interleaved.
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


def _child(mode: str, model: str, args: argparse.Namespace) -> None:
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
            report = engine.kernel_report(llm)
            return [r["trace"] for r in report["ranks"]]

        llm.generate(prompts(0), params, use_tqdm=False)  # warm-up (and the compile, if any)
        before = traces()
        times = []
        for r in range(args.rounds):
            started = time.perf_counter()
            llm.generate(prompts(r + 1), params, use_tqdm=False)
            times.append(time.perf_counter() - started)
        after = traces()
    steps = after[0]["steps"] - before[0]["steps"]
    sent, calls = [], {}
    for b, a in zip(before, after):
        total = {k: a.get("tp_comm_bytes_sent", {}).get(k, 0) - b.get("tp_comm_bytes_sent", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
        sent.append(sum(total.values()) / max(steps, 1))
        calls = {k: a.get("sequence_parallel_norm_ops", {}).get(k, 0) - b.get("sequence_parallel_norm_ops", {}).get(k, 0)
                 for k in ("sequence_parallel", "all_reduce")}
    median = statistics.median(times)
    out.write(json.dumps({"mode": mode, "prefill_tok_s": args.batch * args.prompt_tokens / median,
                          "round_s": times, "steps": steps, "bytes_sent_per_rank_per_step": sent,
                          "norm_op_calls": calls}) + "\n")
    out.flush()


def _run(mode: str, model: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend",
               ASCEND_KERNEL_SEQUENCE_PARALLEL="1", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_CPU_KVCACHE_SPACE="1",
               OMP_WAIT_POLICY="PASSIVE")
    env.pop("ASCEND_KERNEL_SP_MIN_TOKENS", None)
    if MODES[mode] is not None:
        env["ASCEND_KERNEL_SP_MIN_TOKENS"] = str(MODES[mode])
    argv = [sys.executable, __file__, "--child", mode, "--model", str(model), "--rounds", str(args.rounds),
            "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens)]
    if args.compiled:
        argv.append("--compiled")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise SystemExit(f"engine {mode} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [line for line in proc.stdout.splitlines() if line.startswith('{"mode"')]  # vLLM may print on exit
    if not rows:
        raise SystemExit(f"engine {mode} printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
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
    rows = {mode: _run(mode, model, args) for mode in MODES}
    sp, ar = rows["sequence-parallel"], rows["all-reduce"]
    if sp["norm_op_calls"]["sequence_parallel"] == 0 or ar["norm_op_calls"]["sequence_parallel"] != 0:
        raise SystemExit(f"the engines did not run the choices they were set up for: {sp['norm_op_calls']}, "
                         f"{ar['norm_op_calls']}")
    result = {"prompt_tokens": args.prompt_tokens, "batch": args.batch, "hidden_size": args.hidden, "tp": 2,
              "compiled": args.compiled, "engines": rows, "vs_all_reduce": sp["prefill_tok_s"] / ar["prefill_tok_s"]}
    if args.json:
        print(json.dumps(result))
        return
    for mode, row in rows.items():
        print(f"{mode:18s} prefill {row['prefill_tok_s']:9.0f} tok/s   sent per rank per step "
              f"{[round(b / 1e6, 2) for b in row['bytes_sent_per_rank_per_step']]} MB")
    print(f"sequence parallel vs all-reduce: {result['vs_all_reduce']:.2f}x")


if __name__ == "__main__":
    main()

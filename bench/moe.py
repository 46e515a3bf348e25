"""MoE serving throughput: the kernel vs stock vLLM-CPU on a MoE model of realistic width, one run.

The model is a random Qwen2-MoE built by the kernel's tiny-model factory at a
width where expert compute dominates the step (hidden 512, 16 experts, top-4,
4 layers, experts 256 wide; ``--hidden``/``--experts``/``--top-k``/``--layers``/
``--moe-intermediate`` change it).
Each case starts one engine process per variant, in turn (never two at once
on this 2-core host), ``--launches`` times in ABBA order (kernel, stock,
stock, kernel, ...: drift in the host's load falls on both), warms each up,
then times ``--rounds`` greedy batches of ``--prompts`` prompts x ``--tokens``
tokens; a variant's throughput is its median round over all its launches
(generated tokens / wall seconds). The token ids of every variant
are compared with the first variant's: a faster wrong answer is an error.

Cases:
- ``tp1-eager`` and ``tp1-compiled``: kernel vs stock at TP=1, with
  ``enforce_eager`` and with vLLM-CPU's default compilation (Dynamo + inductor);
  ``ratio`` = kernel / stock tokens/s (the goal is >= 1.0). The compiled case
  also runs ``kernel-opaque``: the kernel with ``ASCEND_KERNEL_MOE_TRACE_EXPERTS=false``
  (routed experts one opaque op, as before the traced path), in the same ABBA
  rotation, so ``ratios`` holds before (``kernel-opaque``) and after (``kernel``)
  against the same stock engines.
- ``tp2-ep``: the kernel alone at TP=2 with expert parallelism (stock vLLM-CPU
  segfaults there), so ``stock_tok_s`` and ``ratio`` are null.

Stock runs with ``VLLM_PLUGINS=`` (no platform plugin: vLLM-CPU's own platform)
and no ``ASCEND_KERNEL_*`` variable; the kernel with ``ASCEND_KERNEL_DEVICE=cpu``.

    .venv/bin/python bench/moe.py [--json] [--cases tp1-eager,tp1-compiled,tp2-ep]
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

REPO = Path(__file__).resolve().parents[1]
CASES = {
    # name -> (variants, engine keyword arguments)
    "tp1-eager": (("kernel", "stock"), {"enforce_eager": True}),
    "tp1-compiled": (("kernel", "stock", "kernel-opaque"), {"enforce_eager": False}),
    "tp2-ep": (("kernel",), {"enforce_eager": True, "tensor_parallel_size": 2, "enable_expert_parallel": True}),
}
#: marks the engine process's result line (worker processes may print to the same stdout)
RESULT_TAG = "BENCH_MOE_RESULT "
WORDS = ("river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal", "harbor")


def prompts(n: int) -> list[str]:
    return [f"Note {i}: " + " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(4 + i % 5)) for i in range(n)]


# -- inside an engine process ------------------------------------------------------------------------------------


def engine_main(spec: dict[str, Any]) -> None:
    """Start one engine, warm it up, time the rounds; the result is one tagged stdout line of JSON."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", max_model_len=512, seed=0, **spec["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    texts = prompts(spec["prompts"])
    llm.generate(texts, params, use_tqdm=False)  # warm-up: the same batch once (compiled shapes, caches)
    rates, tokens = [], []
    for _ in range(spec["rounds"]):
        started = time.perf_counter()
        outputs = llm.generate(texts, params, use_tqdm=False)
        wall = time.perf_counter() - started
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        rates.append(sum(len(t) for t in tokens) / wall)
    print(RESULT_TAG + json.dumps({"rates": rates, "tokens": tokens}), flush=True)


# -- the driver ------------------------------------------------------------------------------------------------


def variant_env(variant: str, engine: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.pop("VLLM_PLUGINS", None)
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    if engine.get("tensor_parallel_size", 1) > 1:
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1")
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if variant.startswith("kernel"):
        env["ASCEND_KERNEL_DEVICE"] = "cpu"
        if variant == "kernel-opaque":  # the routed experts as one opaque op under compilation
            env["ASCEND_KERNEL_MOE_TRACE_EXPERTS"] = "false"
    else:
        env["VLLM_PLUGINS"] = ""  # no platform plugin: vLLM-CPU's own platform
    return env


def run_variant(variant: str, engine: dict[str, Any], args: argparse.Namespace, model: Path,
                log: Path) -> dict[str, Any]:
    spec = {"model": str(model), "engine": engine, "tokens": args.tokens, "prompts": args.prompts,
            "rounds": args.rounds}
    with open(log, "wb") as err:
        proc = subprocess.run([sys.executable, __file__, "--engine-spec", json.dumps(spec)], cwd=REPO,
                              env=variant_env(variant, engine), stdout=subprocess.PIPE, stderr=err, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{variant} engine failed (exit {proc.returncode}); log: {log}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def build_model(args: argparse.Namespace, where: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from ascend_kernel.models import create_tiny_model

    overrides = {"hidden_size": args.hidden, "num_experts": args.experts, "num_experts_per_tok": args.top_k,
                 "num_hidden_layers": args.layers, "moe_intermediate_size": args.moe_intermediate}
    return create_tiny_model("qwen2_moe", where / "qwen2_moe", overrides=overrides)


def run_case(name: str, args: argparse.Namespace, model: Path, logs: Path) -> dict[str, Any]:
    variants, engine = CASES[name]
    results: dict[str, dict[str, Any]] = {v: {"rates": [], "tokens": None} for v in variants}
    for launch in range(args.launches):
        # ABBA over launches: drift in the host's load falls on both variants
        for variant in (variants if launch % 2 == 0 else variants[::-1]):
            got = run_variant(variant, engine, args, model, logs / f"{name}-{variant}-{launch}.log")
            results[variant]["rates"] += got["rates"]
            if results[variant]["tokens"] not in (None, got["tokens"]):
                raise SystemExit(f"{name}: {variant}'s tokens changed between launches")
            results[variant]["tokens"] = got["tokens"]
    first = results[variants[0]]["tokens"]
    for variant, result in results.items():
        if result["tokens"] != first:
            same = sum(a == b for a, b in zip(result["tokens"], first))
            raise SystemExit(f"{name}: {variant}'s tokens differ from {variants[0]}'s ({same}/{len(first)} equal)")
    kernel = statistics.median(results["kernel"]["rates"])
    stock = statistics.median(results["stock"]["rates"]) if "stock" in results else None
    return {"case": name, "kernel_tok_s": round(kernel, 1), "stock_tok_s": None if stock is None else round(stock, 1),
            "ratio": None if stock is None else round(kernel / stock, 3), "tokens_equal": len(first),
            "ratios": None if stock is None else {
                v: round(statistics.median(res["rates"]) / stock, 3) for v, res in results.items() if v != "stock"},
            "rounds": {v: [round(r, 1) for r in res["rates"]] for v, res in results.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-spec", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per engine launch")
    parser.add_argument("--launches", type=int, default=2,
                        help="engine launches per variant, in ABBA order; the median is over every round")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--moe-intermediate", type=int, default=256, help="each expert's intermediate width")
    args = parser.parse_args(argv)
    if args.engine_spec:
        engine_main(json.loads(args.engine_spec))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="bench-moe-") as tmp:
        model = build_model(args, Path(tmp))
        logs = Path(tempfile.mkdtemp(prefix="bench-moe-logs-"))
        rows = [run_case(name, args, model, logs) for name in cases]
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'case':<14} {'kernel tok/s':>13} {'stock tok/s':>12} {'ratio':>7}")
        for row in rows:
            stock = "-" if row["stock_tok_s"] is None else f"{row['stock_tok_s']:.1f}"
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            print(f"{row['case']:<14} {row['kernel_tok_s']:>13.1f} {stock:>12} {ratio:>7}")
            for variant, other in (row["ratios"] or {}).items():
                if variant != "kernel":
                    print(f"  {variant} / stock: {other:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

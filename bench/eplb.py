"""Dynamic EPLB on two CPU ranks (TP=2 + EP): load imbalance before/after, step time with vs without, cost.

One tiny DeepSeek-V2 (vLLM's router path; ``--experts`` routed experts,
top-2) is built by the kernel's tiny-model factory. The traffic is skewed: each
prompt is one token id repeated, without BOS, so every prompt token picks the
same experts. Two engines run in turn (never at once on this host), each
warmed up, then timed on ``--rounds`` greedy batches:

* ``eplb``: ``enable_eplb`` with ``step_interval``/``window_size`` small enough
  that rearrangements happen inside the run (policy ``--policy``);
* ``static``: the same engine without EPLB.

Reported (from the ranks' ``eplb`` objects and the timings of this run):
``imbalance_before`` / ``imbalance_after`` (max / mean per-rank expert load
over a window, before the first rearrangement and after the last),
``step_ms`` of each engine (wall seconds per generated token of the batch,
median round), ``step_ratio`` = static / eplb step time (>= 0.97 is the goal:
EPLB's bookkeeping costs at most 3 %), ``rebalance_ms_per_layer``. The token
ids of both engines must be equal (a balanced wrong answer is an error).

    .venv/bin/python bench/eplb.py [--json] [--policy default|swap-limited] [--redundant 2]
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
RESULT_TAG = "BENCH_EPLB_RESULT "
#: the skewed prompts: one token id repeated (no BOS), a different id per prompt
SKEWED_IDS = (263, 87, 261, 300)


def engine_main(spec: dict[str, Any]) -> None:
    """One engine: warm-up, timed rounds, its ranks' reports; one tagged stdout line of JSON."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    section = {"enable_eplb": True, "eplb_config": spec["eplb_config"]} if spec["eplb"] else {}
    llm = LLM(model=spec["model"], dtype="float32", max_model_len=512, seed=0, enforce_eager=True,
              tensor_parallel_size=2, enable_expert_parallel=True, max_num_seqs=8,
              additional_config={"ascend_kernel": section})
    params = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=[t] * spec["prompt_len"]) for t in SKEWED_IDS[: spec["prompts"]]]
    llm.generate(prompts, params, use_tqdm=False)
    step_ms, tokens = [], []
    for _ in range(spec["rounds"]):
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        step_ms.append((time.perf_counter() - started) * 1e3 / spec["tokens"])
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
    reports = llm.collective_rpc("ascend_kernel_report")
    eplb = [r["trace"].get("eplb") for r in reports]
    print(RESULT_TAG + json.dumps({"step_ms": step_ms, "tokens": tokens, "eplb": eplb}), flush=True)


def run_engine(spec: dict[str, Any], logs: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.update(ASCEND_KERNEL_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ENABLE_V1_MULTIPROCESSING="1",
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    log = logs / f"{'eplb' if spec['eplb'] else 'static'}.log"
    with log.open("w") as err:
        proc = subprocess.run([sys.executable, __file__, "--engine-spec", json.dumps(spec)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"engine ({'eplb' if spec['eplb'] else 'static'}) failed, rc {proc.returncode}; log: {log}")
    return json.loads(line[len(RESULT_TAG):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-spec", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--policy", default="default", help="eplb_policy entry (default, swap-limited)")
    parser.add_argument("--redundant", type=int, default=2, help="num_redundant_experts")
    parser.add_argument("--experts", type=int, default=8, help="routed experts of the model")
    parser.add_argument("--prompts", type=int, default=4, choices=range(1, len(SKEWED_IDS) + 1))
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24, help="tokens generated per prompt and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-interval", type=int, default=32)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--static-first", action="store_true", help="start the engine without EPLB first")
    args = parser.parse_args(argv)
    if args.engine_spec:
        engine_main(json.loads(args.engine_spec))
        return 0
    from ascend_kernel.models import create_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        model = create_tiny_model("deepseek_v2", where / "model", overrides={"n_routed_experts": args.experts})
        spec = {"model": str(model), "tokens": args.tokens, "rounds": args.rounds, "prompts": args.prompts,
                "prompt_len": args.prompt_len,
                "eplb_config": {"window_size": args.window, "step_interval": args.step_interval,
                                "num_redundant_experts": args.redundant, "policy": args.policy}}
        if args.static_first:  # the order of the two engines, to see its effect on the step times
            static = run_engine({**spec, "eplb": False}, where)
            with_eplb = run_engine({**spec, "eplb": True}, where)
        else:
            with_eplb = run_engine({**spec, "eplb": True}, where)
            static = run_engine({**spec, "eplb": False}, where)
    if with_eplb["tokens"] != static["tokens"]:
        raise SystemExit("EPLB changed the greedy tokens")
    rank0 = with_eplb["eplb"][0]
    eplb_ms, static_ms = statistics.median(with_eplb["step_ms"]), statistics.median(static["step_ms"])
    result = {
        "policy": rank0["policy"], "experts": args.experts, "redundant": args.redundant,
        "rebalances": rank0["rebalances"], "moved_experts": rank0["moved_experts"],
        "imbalance_before": rank0["imbalance_before"], "imbalance_after": rank0["imbalance_after"],
        "imbalance_after_projected": rank0["imbalance_after_projected"],
        "step_ms_eplb": eplb_ms, "step_ms_static": static_ms, "step_ratio": static_ms / eplb_ms,
        "rebalance_ms_per_layer": rank0["rebalance_ms_per_layer"], "tokens_equal": True,
        "order": "static, eplb" if args.static_first else "eplb, static",
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

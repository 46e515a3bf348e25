"""Dynamic EPLB on two CPU ranks (TP=2 + EP): load imbalance before/after, step time with vs without, cost.

One tiny MoE model (``--arch``: DeepSeek-V2, vLLM's router path, or
Qwen3-MoE, the seam's gating path; ``--experts`` routed experts, top-2) is
built by the kernel's tiny-model factory. The traffic is skewed: each prompt
is one token id repeated, without BOS, so every prompt token picks the same
experts, and the ids are chosen from transformers' own routing of each
candidate's greedy run (prompt and generated tokens): those whose experts
fall most on rank 0 under vLLM's initial placement (:func:`skewed_token_ids`).
Two engines run in turn (never at once on this host), each warmed up, then
timed on ``--rounds`` greedy batches:

* ``eplb``: ``enable_eplb`` with ``step_interval``/``window_size`` small enough
  that rearrangements happen inside the run (policy ``--policy``);
* ``static``: the same engine without EPLB.

Reported (from the ranks' ``eplb`` objects and the timings of this run):
``imbalance_before`` / ``imbalance_after`` (max / mean per-rank expert load
over a window, before the first rearrangement and after the last),
``step_ms`` of each engine (wall milliseconds per generated token of the
batch, median round), ``step_ratio`` = static / eplb step time in steady state
(>= 0.97 is the goal: EPLB's bookkeeping costs at most 3 %): the EPLB engine's
rounds in which no rearrangement ran, whose cost is reported apart
(``rebalance_ms_per_layer``; ``step_ratio_all_rounds`` counts every round).
Two engines started one after the other differ by several percent on this
host whatever they run, so the EPLB engine also times its own per-step EPLB
work in each worker (the layers' map and load record, the window step, the
token count; rearrangements left out): ``bookkeeping_ms_per_step`` on the
slower rank, and its ``bookkeeping_share`` of the step, the part of the
ratio that is EPLB's. The token ids of both engines must be equal (a
balanced wrong answer is an error).

    .venv/bin/python bench/eplb.py [--json] [--arch deepseek_v2|qwen3_moe] [--policy default|swap-limited]
                                   [--redundant 2]
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
#: the token ids :func:`skewed_token_ids` chooses among (the tiny tokenizer's first ids are specials)
CANDIDATE_IDS = range(16, 272)
#: the routed-experts field of each tiny recipe
EXPERTS_FIELD = {"deepseek_v2": "n_routed_experts", "qwen3_moe": "num_experts"}


def initial_rank_share(experts: int, redundant: int, ranks: int) -> Any:
    """[logical, rank]: the share of a logical expert's tokens each rank serves under vLLM's initial map.

    vLLM starts from physical ``i`` -> logical ``i`` for the first ``experts``
    slots and ``i % experts`` for the redundant ones, ``(experts + redundant)
    / ranks`` slots per rank; a token goes to one replica of its expert by a
    hash, so each replica serves an equal share on average.
    """
    import torch

    physical = list(range(experts)) + [i % experts for i in range(redundant)]
    local = len(physical) // ranks
    share = torch.zeros(experts, ranks, dtype=torch.float64)
    for slot, logical in enumerate(physical):
        share[logical, slot // local] += 1
    return share / share.sum(dim=1, keepdim=True)


def skewed_token_ids(model: Path, count: int, prompt_len: int, tokens: int, share: Any) -> tuple[list[int], float]:
    """The ``count`` candidate ids whose greedy runs load rank 0 most, by transformers' routing; rank 0's share.

    Every candidate prompt (the id repeated ``prompt_len`` times) is generated
    for ``tokens`` tokens by transformers in one batch (equal lengths: no
    padding); a hook on every router collects the experts each position
    picked (prefill and decode), and a candidate's score is rank 0's share of
    its load under ``share``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    candidates = torch.tensor(list(CANDIDATE_IDS))
    picked: list[Any] = []
    hooks = [module.register_forward_hook(lambda _m, _i, out: picked.append(out[-1].reshape(len(candidates), -1)))
             for module in hf.modules() if type(module).__name__.endswith("Router")]
    if not hooks:
        raise SystemExit(f"no router module found in {model} (the skew needs transformers' routing)")
    with torch.no_grad():
        hf.generate(candidates.unsqueeze(1).expand(-1, prompt_len), max_new_tokens=tokens, min_new_tokens=tokens,
                    do_sample=False, pad_token_id=0)
    for hook in hooks:
        hook.remove()
    per_rank = share[torch.cat(picked, dim=1)].sum(dim=1)  # [candidates, ranks]
    rank0 = per_rank[:, 0] / per_rank.sum(dim=1)
    best = torch.argsort(rank0, descending=True, stable=True)[:count]
    chosen = per_rank[best].sum(dim=0)
    return candidates[best].tolist(), float(chosen[0] / chosen.sum())


#: EPLB's per-step work in a worker: the layers' map and load record, the window step, the token count
BOOKKEEPING = (("ascend_kernel_plugins.moe_comm.layer", None, "to_physical"), (None, "eplb_state", "step"),
               (None, "eplb_state", "prepare_forward"), (None, "eplb_state", "rearrange"))


def time_bookkeeping(worker: Any) -> bool:
    """In a worker (collective RPC): wrap EPLB's per-step pieces with wall-clock accumulators."""
    import importlib
    import time as clock

    spent: dict[str, float] = {}

    def timed(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = clock.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + clock.perf_counter() - started

        setattr(owner, name, wrapper)

    for module, attribute, name in BOOKKEEPING:
        timed(importlib.import_module(module) if module else getattr(worker.model_runner, attribute), name)
    worker.bench_bookkeeping = spent
    return True


def read_bookkeeping(worker: Any) -> dict[str, float]:
    """Milliseconds spent in each wrapped piece since the last read (then reset)."""
    spent = dict(worker.bench_bookkeeping)
    worker.bench_bookkeeping.clear()
    return {name: seconds * 1e3 for name, seconds in spent.items()}


def engine_main(spec: dict[str, Any]) -> None:
    """One engine: warm-up, timed rounds, its ranks' reports; one tagged stdout line of JSON."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    section = {"enable_eplb": True, "eplb_config": spec["eplb_config"]} if spec["eplb"] else {}
    llm = LLM(model=spec["model"], dtype="float32", max_model_len=512, seed=0, enforce_eager=True,
              tensor_parallel_size=2, enable_expert_parallel=True, max_num_seqs=8,
              additional_config={"ascend_kernel": section})
    params = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=[t] * spec["prompt_len"]) for t in spec["token_ids"]]
    llm.generate(prompts, params, use_tqdm=False)

    def rebalances() -> int:  # outside the timed region: a collective RPC per round
        eplb = llm.collective_rpc("ascend_kernel_report")[0]["trace"].get("eplb")
        return eplb["rebalances"] if eplb else 0

    if spec["eplb"]:
        llm.collective_rpc(time_bookkeeping)
    step_ms, rearranged, tokens = [], [], []
    for _ in range(spec["rounds"]):
        before = rebalances()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        step_ms.append((time.perf_counter() - started) * 1e3 / spec["tokens"])
        rearranged.append(rebalances() != before)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
    reports = llm.collective_rpc("ascend_kernel_report")
    eplb = [r["trace"].get("eplb") for r in reports]
    bookkeeping = llm.collective_rpc(read_bookkeeping) if spec["eplb"] else []
    steps = spec["rounds"] * spec["tokens"]
    print(RESULT_TAG + json.dumps({"step_ms": step_ms, "rearranged": rearranged, "tokens": tokens, "eplb": eplb,
                                   "bookkeeping": bookkeeping, "steps": steps}), flush=True)


def run_engine(spec: dict[str, Any], logs: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.update(ASCEND_KERNEL_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ENABLE_V1_MULTIPROCESSING="1",
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # the bookkeeping timers go to the workers as functions
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
    parser.add_argument("--arch", default="deepseek_v2", choices=sorted(EXPERTS_FIELD), help="tiny MoE model")
    parser.add_argument("--policy", default="default", help="eplb_policy entry (default, swap-limited)")
    parser.add_argument("--redundant", type=int, default=2, help="num_redundant_experts")
    parser.add_argument("--experts", type=int, default=8, help="routed experts of the model")
    parser.add_argument("--prompts", type=int, default=4, help="skewed prompts per batch")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24, help="tokens generated per prompt and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--step-interval", type=int, default=64)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--static-first", action="store_true", help="start the engine without EPLB first")
    args = parser.parse_args(argv)
    if args.engine_spec:
        engine_main(json.loads(args.engine_spec))
        return 0
    from ascend_kernel.models import create_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        model = create_tiny_model(args.arch, where / "model", overrides={EXPERTS_FIELD[args.arch]: args.experts})
        share = initial_rank_share(args.experts, args.redundant, 2)
        token_ids, rank0_share = skewed_token_ids(model, args.prompts, args.prompt_len, args.tokens, share)
        spec = {"model": str(model), "tokens": args.tokens, "rounds": args.rounds, "token_ids": token_ids,
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
    steady = [ms for ms, moved in zip(with_eplb["step_ms"], with_eplb["rearranged"]) if not moved]
    if not steady:
        raise SystemExit("every timed round ran a rearrangement: raise --step-interval or --rounds")
    eplb_ms, static_ms = statistics.median(steady), statistics.median(static["step_ms"])
    # per step, on the slower rank: the map, the window step and the token count, rearrangements left out
    bookkeeping_ms = max((spent.get("to_physical", 0.0) + spent.get("step", 0.0) - spent.get("rearrange", 0.0)
                          + spent.get("prepare_forward", 0.0)) for spent in with_eplb["bookkeeping"])
    bookkeeping_ms /= with_eplb["steps"]
    result = {
        "arch": args.arch, "token_ids": token_ids, "rank0_share_by_transformers": rank0_share,
        "policy": rank0["policy"], "experts": args.experts, "redundant": args.redundant,
        "rebalances": rank0["rebalances"], "moved_experts": rank0["moved_experts"],
        "imbalance_before": rank0["imbalance_before"], "imbalance_after": rank0["imbalance_after"],
        "imbalance_after_projected": rank0["imbalance_after_projected"],
        "step_ms_eplb": eplb_ms, "step_ms_static": static_ms, "step_ratio": static_ms / eplb_ms,
        "steady_rounds": len(steady),
        "bookkeeping_ms_per_step": bookkeeping_ms, "bookkeeping_share": bookkeeping_ms / eplb_ms,
        "bookkeeping_pieces_ms_per_step": [{name: ms / with_eplb["steps"] for name, ms in spent.items()}
                                           for spent in with_eplb["bookkeeping"]],
        "step_ratio_all_rounds": static_ms / statistics.median(with_eplb["step_ms"]),
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

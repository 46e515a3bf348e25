"""The kernel's samplers vs vLLM's default sampler on vLLM-CPU, same logits, one invocation.

Cases (vocabulary 151,936 by default, batch 1/8/64, temperature 1):
``top_k`` (k = 50), ``top_p`` (p = 0.9), ``top_k_top_p`` (both), ``greedy``.
Each call gets the same logits and the same global RNG state for both
samplers; calls alternate, in an order that flips every round (ABBA: running
first or second is not free, and with a fixed order that cost fell on one side),
and the median (or ``--stat min``) of ``--repeats`` is reported, with the speedup vLLM/kernel and whether both drew the same
tokens.

Logits are ``scale * N(0, 1)``; the default scale 5 gives an LLM-like row
(top token ~25%, the 0.9 nucleus ~100 tokens). A flatter row (``--logit-scale 3``:
nucleus ~7,000 tokens) makes top-p alone sort like vLLM; ``--bf16-logits``
rounds the logits to bfloat16 values (a bf16 model's logits: many ties, and
a top-p boundary inside a run of equal values makes the row sort like vLLM).

    .venv/bin/python bench/sampler.py [--json] [--samplers fast-cpu,ascend-topk-topp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

CASES = ("top_k", "top_p", "top_k_top_p", "greedy")


def build_samplers(names: list[str]) -> dict[str, object]:
    from ascend_kernel.device import DeviceInfo
    from ascend_kernel.plugin_manager import KernelPluginManager
    from ascend_kernel.settings import load_settings
    from ascend_kernel.upstream import vllm_c_ops

    vllm_c_ops()  # vLLM-CPU's sampling kernels, the build this CPU runs (vLLM's platform picks AVX2 or AVX-512)

    config = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode="raw_logprobs", use_fp64_gumbel=False))
    settings = load_settings()
    ctx = SimpleNamespace(vllm_config=config, settings=settings, device=DeviceInfo(kind="cpu", soc=None), subject=None)
    entries = {e.name: e for e in KernelPluginManager(settings).implementations("ascend_kernel_samplers", "sampler")}
    return {name: entries[name].build(ctx).build(config) for name in ["vllm-default", *names]}


def metadata(case: str, batch: int):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    greedy = case == "greedy"
    return SamplingMetadata(
        temperature=None if greedy else torch.ones(batch), all_greedy=greedy, all_random=not greedy,
        top_k=torch.full((batch,), 50, dtype=torch.int32) if case in ("top_k", "top_k_top_p") else None,
        top_p=torch.full((batch,), 0.9) if case in ("top_p", "top_k_top_p") else None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def measure(samplers: dict, case: str, batch: int, vocab: int, scale: float, bf16: bool, repeats: int,
            stat=statistics.median) -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(batch * 1000 + CASES.index(case))
    logits = torch.randn(batch, vocab, generator=gen) * scale
    if bf16:
        logits = logits.bfloat16().float()
    meta = metadata(case, batch)
    times: dict[str, list[float]] = {name: [] for name in samplers}
    tokens: dict[str, torch.Tensor] = {}
    names = list(samplers)
    for i in range(repeats + 1):  # the first round warms up
        # the order flips every round (ABBA...), so whatever running first or second costs falls on both sides
        for name in (names if i % 2 else names[::-1]):
            sampler = samplers[name]
            x = logits.clone()
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = sampler(logits=x, sampling_metadata=meta)
            elapsed = time.perf_counter() - t0
            if i:
                times[name].append(elapsed * 1e3)
            if i == 1:
                tokens[name] = out.sampled_token_ids
    base = stat(times["vllm-default"])
    rows = []
    for name in samplers:
        if name == "vllm-default":
            continue
        ms = stat(times[name])
        rows.append({"case": case, "batch": batch, "sampler": name, "vllm_ms": round(base, 3),
                     "kernel_ms": round(ms, 3), "speedup": round(base / ms, 3),
                     "same_tokens": bool(torch.equal(tokens[name], tokens["vllm-default"]))})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,8,64")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--samplers", default="fast-cpu", help="kernel samplers to compare (comma-separated)")
    ap.add_argument("--logit-scale", type=float, default=5.0)
    ap.add_argument("--bf16-logits", action="store_true")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="per-call time reported (min: best of the repeats, steadier on a shared host)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    samplers = build_samplers([s for s in args.samplers.split(",") if s])
    rows = []
    for case in args.cases.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            rows += measure(samplers, case, batch, args.vocab, args.logit_scale, args.bf16_logits, args.repeats,
                            statistics.median if args.stat == "median" else min)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'case':>12} {'batch':>5} {'sampler':>16} {'vllm ms':>9} {'kernel ms':>9} {'speedup':>7} same tokens")
    for r in rows:
        print(f"{r['case']:>12} {r['batch']:>5} {r['sampler']:>16} {r['vllm_ms']:>9.2f} {r['kernel_ms']:>9.2f} "
              f"{r['speedup']:>7.2f} {r['same_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

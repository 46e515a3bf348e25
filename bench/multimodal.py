"""Vision-language requests through the kernel vs stock vLLM-CPU: time to first token and decode speed.

vLLM fixes its platform per process, so a kernel engine and a stock engine always live in two processes, and
two processes of the *same* engine differ by several per cent on a small shared host (memory placement;
``bench/step_overhead.py`` measures it). Timing one engine after the other adds the host's drift on top. So
each *launch* starts both engines side by side (``EnginePipe`` workers, waiting passively while the other
runs), and the parent sends them the same requests in turn, the order flipped every pair (ABBA): each pair
is two measurements seconds apart, on the same images, whose ratio is free of drift. ``--launches`` draws
new processes (new placements); every launch is warmed up before it is timed.

A pair, per image count and repetition (``--reps``):

* ``ttft``: one request with fresh images (seeded noise never seen before, so neither the processor cache nor
  the encoder cache serves them; prefix caching is off) and ``max_tokens=1``: processing, the vision encoder
  and the prefill;
* ``decode``: the same request shape with other fresh images and ``1 + --decode`` tokens; the decode rate is
  ``--decode / (time - the same engine's ttft just measured)``.

Both engines answer the same images, so their greedy tokens must be equal (a faster wrong answer stops the
bench). Rows (``--json``): ``{model, engine, images, ttft_ms, decode_tok_s, vs_stock}``; ``vs_stock`` is the
median of the paired ratios, oriented so that higher is better for both (stock ttft / kernel ttft, kernel
tok/s / stock tok/s), with ``vs_stock_range`` the launches' medians (lowest, highest).

    .venv/bin/python bench/multimodal.py --model .cache/tiny-models/qwen2_5_vl-seed0 [--json]
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

FLAVOURS = ("kernel", "stock")


def _image(path: Path, seed: int, width: int, height: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")
    return str(path)


def worker(args: argparse.Namespace) -> None:
    """One engine (kernel or stock): a hello line once built, then one answer line per request line."""
    import contextlib

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the idle engine must not spin on the shared cores
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        from ascend_kernel.cli import engine, images

        engine.prepare_process(kernel=args.worker == "kernel")
        from vllm import SamplingParams

        llm = engine.build_llm(engine.EngineRequest(model=args.model, extra={
            "limit_mm_per_prompt": {"image": max(args.images), "video": 0}, "enable_prefix_caching": False}))
    folder = Path(tempfile.mkdtemp(prefix="mm-bench-"))
    out.write(json.dumps({"pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        paths = [_image(folder / f"{seed}.png", seed, args.width, args.height) for seed in request["seeds"]]
        with contextlib.redirect_stdout(sys.stderr):
            [prompt] = images.prompt_inputs(llm, [(args.question, True)], [paths])
            params = SamplingParams(max_tokens=request["tokens"], temperature=0.0, ignore_eos=True)
            started = time.perf_counter()
            [result] = llm.generate([prompt], params, use_tqdm=False)
            elapsed = time.perf_counter() - started
        for path in paths:
            os.unlink(path)
        out.write(json.dumps({"s": elapsed, "ids": list(result.outputs[0].token_ids)}) + "\n")
        out.flush()
    with contextlib.redirect_stdout(sys.stderr):
        engine.shutdown(llm)


class Seeds:
    """Fresh image seeds: never the same image twice in a run, the same for both engines of a pair."""

    def __init__(self, base: int) -> None:
        self.next = base * 1_000_000

    def take(self, count: int) -> list[int]:
        self.next += count
        return list(range(self.next - count, self.next))


def _pair(engines: dict[str, EnginePipe], order: tuple[str, ...], request: dict[str, Any]) -> dict[str, Any]:
    answers = {name: engines[name].ask(request) for name in order}
    if answers["kernel"]["ids"] != answers["stock"]["ids"]:
        raise SystemExit(f"kernel and stock tokens differ for images {request['seeds']}: "
                         f"{answers['kernel']['ids']} vs {answers['stock']['ids']}")
    return {name: answers[name]["s"] for name in FLAVOURS}


def launch(args: argparse.Namespace, index: int, seeds: Seeds) -> dict[int, dict[str, list[float]]]:
    """One kernel and one stock process, warmed up, then ``--reps`` ABBA pairs per image count."""
    worker_args = ["--model", args.model, "--width", str(args.width), "--height", str(args.height),
                   "--question", args.question, *[x for n in args.images for x in ("--images", str(n))]]
    starts = FLAVOURS if index % 2 == 0 else FLAVOURS[::-1]  # which process is built first alternates too
    engines = {name: EnginePipe(__file__, name, [name, *worker_args]) for name in starts}
    samples: dict[int, dict[str, list[float]]] = {}
    try:
        for count in args.images:  # warm-up: every shape on both
            for tokens in (1, 1 + args.decode):
                _pair(engines, FLAVOURS, {"seeds": seeds.take(count), "tokens": tokens})
        for count in args.images:
            got: dict[str, list[float]] = {f"{name}_{key}": [] for name in FLAVOURS for key in ("ttft", "rate")}
            for rep in range(args.reps):
                order = FLAVOURS if (rep + index) % 2 == 0 else FLAVOURS[::-1]
                ttft = _pair(engines, order, {"seeds": seeds.take(count), "tokens": 1})
                whole = _pair(engines, order[::-1], {"seeds": seeds.take(count), "tokens": 1 + args.decode})
                for name in FLAVOURS:
                    got[f"{name}_ttft"].append(ttft[name])
                    got[f"{name}_rate"].append(args.decode / max(whole[name] - ttft[name], 1e-9))
            samples[count] = got
    finally:
        for engine in engines.values():
            engine.close()
    return samples


def summarize(args: argparse.Namespace, launches: list[dict[int, dict[str, list[float]]]]) -> list[dict[str, Any]]:
    rows = []
    for count in args.images:
        runs = [run[count] for run in launches]
        every = {key: [v for run in runs for v in run[key]] for key in runs[0]}
        ttft_pairs = [s / k for run in runs for k, s in zip(run["kernel_ttft"], run["stock_ttft"])]
        rate_pairs = [k / s for run in runs for k, s in zip(run["kernel_rate"], run["stock_rate"])]
        per_launch = [(statistics.median(s / k for k, s in zip(run["kernel_ttft"], run["stock_ttft"])),
                       statistics.median(k / s for k, s in zip(run["kernel_rate"], run["stock_rate"])))
                      for run in runs]
        for name in FLAVOURS:
            row: dict[str, Any] = {"model": args.model, "engine": name, "images": count,
                                   "ttft_ms": round(statistics.median(every[f"{name}_ttft"]) * 1e3, 2),
                                   "decode_tok_s": round(statistics.median(every[f"{name}_rate"]), 2),
                                   "vs_stock": None}
            if name == "kernel":
                row["vs_stock"] = {"ttft": round(statistics.median(ttft_pairs), 3),
                                   "decode": round(statistics.median(rate_pairs), 3)}
                row["vs_stock_range"] = {
                    "ttft": [round(min(t for t, _ in per_launch), 3), round(max(t for t, _ in per_launch), 3)],
                    "decode": [round(min(d for _, d in per_launch), 3), round(max(d for _, d in per_launch), 3)]}
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a vision-language model directory (tiny-model --arch qwen2_5_vl)")
    p.add_argument("--images", type=int, action="append", help="images per request (repeatable; default 1 and 2)")
    p.add_argument("--launches", type=int, default=3, help="kernel + stock process pairs, each side by side")
    p.add_argument("--reps", type=int, default=8, help="ABBA pairs per image count and launch")
    p.add_argument("--decode", type=int, default=32, help="decode tokens timed per request")
    p.add_argument("--width", type=int, default=224)
    p.add_argument("--height", type=int, default=168)
    p.add_argument("--question", default="What is in the picture?")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=FLAVOURS, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.images = args.images or [1, 2]
    if args.worker:
        worker(args)
        return
    seeds = Seeds(args.seed)
    rows = summarize(args, [launch(args, i, seeds) for i in range(args.launches)])
    if args.json:
        print(json.dumps({"rows": rows, "launches": args.launches, "reps": args.reps}, indent=1))
        return
    for row in rows:
        extra = f"  vs stock {row['vs_stock']} (launches {row['vs_stock_range']})" if row["vs_stock"] else ""
        print(f"{row['engine']:6} images={row['images']} ttft {row['ttft_ms']:8.2f} ms  "
              f"decode {row['decode_tok_s']:7.1f} tok/s{extra}")


if __name__ == "__main__":
    main()

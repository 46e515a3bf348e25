"""Vision-language requests through the kernel vs stock vLLM-CPU: time to first token and decode speed.

Each engine runs in a process of its own (vLLM fixes its platform per process); the parent starts a kernel
child and a stock child per round, alternating which goes first, for ``--rounds`` rounds, and reports
medians over every measurement. A child builds one engine on the model (prefix caching off, so every
request encodes its images and prefills in full), warms it up, then ``--reps`` times per image count:

* ``ttft_ms``: one request with fresh images (seeded noise, never seen before, so neither the
  processor cache nor the encoder cache serves them) and ``max_tokens=1``: processing, the vision
  encoder and the prefill;
* ``decode_tok_s``: the same request shape with other fresh images and ``1 + --decode`` tokens; the
  decode rate is ``--decode / (time - the ttft just measured)``.

``vs_stock`` is kernel over stock, oriented so that higher is better for both: stock ttft / kernel ttft,
kernel tok/s / stock tok/s.

    .venv/bin/python bench/multimodal.py --model .cache/tiny-models/qwen2_5_vl-seed0 [--json]
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


def _image(path: Path, seed: int, width: int, height: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")
    return str(path)


def child(args: argparse.Namespace) -> None:
    """One engine (kernel or stock): print one JSON object of raw measurements."""
    from ascend_kernel.cli import engine, images

    engine.prepare_process(kernel=args.flavour == "kernel")
    from vllm import SamplingParams

    most = max(args.images)
    llm = engine.build_llm(engine.EngineRequest(model=args.model, extra={
        "limit_mm_per_prompt": {"image": most, "video": 0}, "enable_prefix_caching": False}))
    folder, seed = Path(tempfile.mkdtemp(prefix="mm-bench-")), args.seed * 100_000

    def request(count: int, tokens: int) -> float:
        nonlocal seed
        paths = []
        for _ in range(count):
            seed += 1
            paths.append(_image(folder / f"{seed}.png", seed, args.width, args.height))
        [prompt] = images.prompt_inputs(llm, [(args.question, True)], [paths])
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - started

    for count in args.images:  # warm-up: every shape once
        request(count, 2)
    out: dict[str, Any] = {}
    for count in args.images:
        ttft, rate = [], []
        for _ in range(args.reps):
            ttft.append(request(count, 1))
            whole = request(count, 1 + args.decode)  # same shape, other fresh images
            rate.append(args.decode / max(whole - ttft[-1], 1e-9))
        out[str(count)] = {"ttft_s": ttft, "decode_tok_s": rate}
    engine.shutdown(llm)
    print("RESULT " + json.dumps(out), flush=True)


def parent(args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"kernel": [], "stock": []}
    for r in range(args.rounds):
        for flavour in (("kernel", "stock") if r % 2 == 0 else ("stock", "kernel")):
            cmd = [sys.executable, __file__, "--child", flavour, "--model", args.model, "--seed", str(r),
                   "--reps", str(args.reps), "--decode", str(args.decode), "--width", str(args.width),
                   "--height", str(args.height), "--question", args.question,
                   *[x for n in args.images for x in ("--images", str(n))]]
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"{flavour} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            runs[flavour].append(json.loads(line[len("RESULT "):]))
    rows = []
    for count in args.images:
        med = {f: {k: statistics.median(v for run in runs[f] for v in run[str(count)][k])
                   for k in ("ttft_s", "decode_tok_s")} for f in runs}
        for flavour in ("kernel", "stock"):
            rows.append({"model": args.model, "engine": flavour, "images": count,
                         "ttft_ms": round(med[flavour]["ttft_s"] * 1e3, 2),
                         "decode_tok_s": round(med[flavour]["decode_tok_s"], 2),
                         "vs_stock": None if flavour == "stock" else {
                             "ttft": round(med["stock"]["ttft_s"] / med["kernel"]["ttft_s"], 3),
                             "decode": round(med["kernel"]["decode_tok_s"] / med["stock"]["decode_tok_s"], 3)}})
    if args.json:
        print(json.dumps({"rows": rows, "rounds": args.rounds, "reps": args.reps}, indent=1))
        return
    for row in rows:
        print(f"{row['engine']:6} images={row['images']} ttft {row['ttft_ms']:8.1f} ms  "
              f"decode {row['decode_tok_s']:7.1f} tok/s  vs stock {row['vs_stock']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a vision-language model directory (tiny-model --arch qwen2_5_vl)")
    p.add_argument("--images", type=int, action="append", help="images per request (repeatable; default 1 and 2)")
    p.add_argument("--rounds", type=int, default=2, help="kernel + stock process pairs")
    p.add_argument("--reps", type=int, default=5, help="measurements per image count and process")
    p.add_argument("--decode", type=int, default=32, help="decode tokens timed per request")
    p.add_argument("--width", type=int, default=224)
    p.add_argument("--height", type=int, default=168)
    p.add_argument("--question", default="What is in the picture?")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=("kernel", "stock"), dest="flavour", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.images = args.images or [1, 2]
    if args.flavour:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()

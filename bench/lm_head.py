"""lm-head TP's memory: the lm head's weight bytes per rank without (N=1) and with lm-head TP (N=2), and what
each rank receives per step for it.

No timing: the figure lm-head TP changes is the head's memory per rank
(upstream: 1.48 GB less per rank on DeepSeek-R1 W8A8 pure DP), and the
price is two collectives per step. Both are computed by the functions the
kernel's report and collectives use (``head_report``: the report's
``lm_head`` object, checked against built heads by tests/test_lm_head_tp.py;
``collective_bytes``), for the tiny MoE model of the e2e suite (DeepSeek-V2
shaped, float32) and for DeepSeek-R1's head (vocab 129,280 x hidden 7,168,
bfloat16 weights, float32 logits). The baseline is N=1 in the same run.

    .venv/bin/python bench/lm_head.py [--json] [--tp 2] [--tokens 1,64]
"""

from __future__ import annotations

import argparse
import json

#: name -> (vocab, hidden, weight bytes per element, logits bytes per element)
MODELS = {"tiny-deepseek_v2 (fp32)": (973, 128, 4, 4), "DeepSeek-R1 (bf16)": (129_280, 7_168, 2, 4)}


def measure(tp: int, tokens: list[int]) -> list[dict]:
    from ascend_kernel.ops.lm_head_tp import collective_bytes
    from ascend_kernel_plugins.layers.lm_head_config import head_report

    rows = []
    for name, (vocab, hidden, weight_bytes, logits_bytes) in MODELS.items():
        base, sharded = head_report(vocab, hidden, 1, weight_bytes), head_report(vocab, hidden, tp, weight_bytes)
        rows.append({"model": name, "tp_size": tp, "bytes_without": base["bytes"], "bytes_with": sharded["bytes"],
                     "saved_bytes": base["bytes"] - sharded["bytes"], "ratio": sharded["bytes"] / base["bytes"],
                     "vocab_per_rank": sharded["vocab_per_rank"],
                     "received_bytes_per_step": {str(t): collective_bytes(t, hidden, sharded["vocab_per_rank"], tp,
                                                                          weight_bytes, logits_bytes)
                                                 for t in tokens}})
    return rows


def size(n: float) -> str:
    """Bytes in the largest unit that keeps a digit before the point."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tp", type=int, default=2, help="the lm-head group size (default 2)")
    parser.add_argument("--tokens", default="1,64", help="tokens per rank per step for the collective bytes")
    args = parser.parse_args()
    rows = measure(args.tp, [int(t) for t in args.tokens.split(",")])
    if args.json:
        print(json.dumps({"lm_head_tp": rows}))
        return
    for row in rows:
        steps = ", ".join(f"{t} tok/rank: {size(b)}" for t, b in row["received_bytes_per_step"].items())
        print(f"{row['model']}: lm head per rank {size(row['bytes_without'])} -> {size(row['bytes_with'])}"
              f" at N={row['tp_size']} (x{row['ratio']:.3f}, {size(row['saved_bytes'])} saved, "
              f"{row['vocab_per_rank']} vocab rows a rank); received per step: {steps}")


if __name__ == "__main__":
    main()

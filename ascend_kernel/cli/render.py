"""Plain-text tables for the CLI (JSON output bypasses this)."""

from __future__ import annotations

from typing import Any, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def decisions_table(report: dict[str, Any]) -> str:
    rows = []
    for d in report["decisions"]:
        passed = [f"{c['name']}: {c['reason']}" for c in d["candidates"] if not c["chosen"]]
        rows.append([d["family"] + (f"[{d['subject']}]" if d["subject"] else ""), d["chosen"] or "-",
                     d["plugin"] or "-", d["forced_by"] if d["chosen"] else "unused",
                     "; ".join(passed) or "-"])
    return table(["family", "chosen", "plugin", "why", "passed over"], rows)


def kv_table(report: dict[str, Any]) -> str:
    kv = report.get("kv_cache") or {}
    rows = [[u["spec"], u["layout"], u["layers"], u["placements"], u.get("page_bytes", ""), u["bytes"]]
            for u in kv.get("layouts", [])]
    head = (f"KV cache: requested {kv.get('requested_bytes', 0)} B, allocated {kv.get('allocated_bytes', 0)} B, "
            f"alignment {kv.get('alignment', 1)} B, slack {kv.get('slack_bytes', 0)} B")
    return head + "\n" + table(["spec", "layout", "layers", "tensors", "page bytes", "bytes"], rows)


def report_text(report: dict[str, Any] | None) -> str:
    if report is None:
        return "(stock vLLM: the kernel was not active)"
    parts = [f"device: {report['device']}", decisions_table(report)]
    if report.get("kv_cache"):
        parts.append(kv_table(report))
    if report.get("trace"):
        t = report["trace"]
        parts.append(f"step trace: {t['steps']} steps, attention states {t['attention_states']}, "
                     f"MoE methods {t['moe_methods'] or '-'}, sampler calls {t['sampler_calls']}, "
                     f"rejection-sampler calls {t['rejection_sampler_calls']}, drafter calls {t['drafter_calls']}")
        if t.get("encoder"):  # a multimodal model (plugins/layers/encoder_cache.py)
            parts.append(f"vision encoder: {t['encoder']['encoder_runs']} runs, "
                         f"{t['encoder']['encoder_cache_hits']} encoder-cache hits")
    graph = report.get("graph") or {}
    if graph.get("captured_sizes"):
        parts.append(f"graph: {graph['mode']}, captured {graph['captured_sizes']} in {graph['capture_s']} s, "
                     f"replays {graph['replays'] or '-'}, eager fallbacks {graph['eager_fallbacks']} ({graph['why']})")
    if report.get("config_changes"):
        parts.append("config changes:\n" + "\n".join(
            f"  {c['path']}: {c['old']} -> {c['new']} ({c['plugin']}: {c['reason']})" for c in report["config_changes"]))
    return "\n\n".join(parts)

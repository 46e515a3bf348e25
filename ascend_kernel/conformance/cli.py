"""``ascend-kernel conformance``: run the kit from the shell (see :mod:`ascend_kernel.conformance`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

#: exit status when a contract is broken (2 stays the CLI's status for bad arguments and kernel errors)
EXIT_BROKEN = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", metavar="NAME",
                   help="a plugin to check (repeatable); every loaded plugin when omitted")
    p.add_argument("--distributed", action="store_true",
                   help="also run MoE comm methods on two gloo ranks (starts two processes per method)")
    p.add_argument("--cache-dir", default=None, type=_cache_dir,
                   help="where the kit keeps its tiny models (default: ~/.cache/ascend-kernel/conformance)")


def _cache_dir(text: str) -> str:
    """A directory the kit can write its tiny models into (made if missing)."""
    path = Path(text)
    problem = None
    if not text.strip() or "\0" in text:
        problem = "is no path"
    elif path.exists() and not path.is_dir():
        problem = "is a file, not a directory"
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = f"cannot be created ({exc.strerror or exc})"
        else:
            if not os.access(path, os.W_OK | os.X_OK):
                problem = "is not writable"
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; give a directory the kit may write its tiny models to")
    return text


def run(args: argparse.Namespace, quiet_stdout: Any) -> int:
    """Results as a table (or JSON with ``--json``) on stdout; each broken contract as a line on stderr."""
    from ascend_kernel.cli.render import table
    from ascend_kernel.conformance.runner import UnknownPluginError, run_conformance
    from ascend_kernel.errors import UsageError

    try:
        with quiet_stdout():  # vLLM logs while configs are built; stdout is the report's
            report = run_conformance(args.plugin, distributed=args.distributed, cache_dir=args.cache_dir)
    except UnknownPluginError as exc:
        raise UsageError(f"--plugin: {exc}") from None
    counts = report.counts()
    if args.json:
        document = json.dumps(report.as_dict(), indent=2)
        out = getattr(args, "json_stdout", None)  # --json: the CLI keeps the real stdout for the document alone
        out.write(document) if out is not None else print(document)
    else:
        print(table(["plugin", "family", "implementation", "contract", "status", "reason"],
                    [[r.plugin, r.family, r.implementation, r.contract, r.status, _short(r.reason)]
                     for r in report.results]))
        print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    for failure in report.failures:
        print(f"ascend-kernel conformance: {failure.line()}", file=sys.stderr)
    return EXIT_BROKEN if report.failures else 0


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

#!/usr/bin/env python3
"""Check the kernel core's size budget: only the kernel in the kernel package.

The core is ``ascend_kernel/`` without the parts that are not the kernel (the
CLI, the ops seam, the conformance kit and the test/demo models). It may hold
at most :data:`MAX_CODE_LINES` lines of code (docstrings, comments and blank
lines not counted) and no file longer than :data:`MAX_FILE_LINES` lines (all
lines counted), and it never imports the layers above it (the CLI, the
models). Run ``python tools/core_budget.py`` from anywhere; it prints
each file's count and exits 1 when the budget is broken. ``--json`` prints the
same as one object.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ascend_kernel"
#: ``upstream.py`` is the declared contract with vLLM's and torch's private names (a table of names and one-line
#: accessors): a seam to what is below the kernel, like ``ops`` is to the hardware, not kernel logic
NOT_CORE = ("cli", "ops", "conformance", "models", "upstream.py")
MAX_CODE_LINES = 2000
MAX_FILE_LINES = 500


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding at least one token of code (not a comment, not part of a docstring)."""
    skip = docstring_lines(ast.parse(source))
    ignored = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in ignored:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in skip)
    return len(lines)


def upward_imports(source: str) -> list[str]:
    """Modules of the layers above the core (CLI, models) that ``source`` imports."""
    above = tuple(f"ascend_kernel.{name}" for name in ("cli", "models"))
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n == above[0] or n == above[1] or n.startswith(tuple(a + "." for a in above))]
    return found


def core_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.relative_to(root).parts[0] not in NOT_CORE)


def measure(root: Path = ROOT) -> dict:
    files = {}
    for path in core_files(root):
        source = path.read_text()
        files[str(path.relative_to(root.parent))] = {"code": code_lines(source), "lines": source.count("\n"),
                                                      "imports_above": upward_imports(source)}
    total = sum(f["code"] for f in files.values())
    too_long = sorted(name for name, f in files.items() if f["lines"] > MAX_FILE_LINES)
    upward = sorted(f"{name} imports {', '.join(f['imports_above'])}" for name, f in files.items()
                    if f["imports_above"])
    return {"files": files, "code_lines": total, "max_code_lines": MAX_CODE_LINES, "max_file_lines": MAX_FILE_LINES,
            "too_long": too_long, "upward_imports": upward,
            "ok": total <= MAX_CODE_LINES and not too_long and not upward}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurement as one JSON object")
    args = parser.parse_args(argv)
    report = measure()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, f in sorted(report["files"].items(), key=lambda item: -item[1]["code"]):
            print(f"{f['code']:6d} code {f['lines']:6d} lines  {name}")
        print(f"{report['code_lines']:6d} code lines in the core (budget {MAX_CODE_LINES}); "
              f"files over {MAX_FILE_LINES} lines: {', '.join(report['too_long']) or 'none'}")
        for line in report["upward_imports"]:
            print(f"upward import: {line}")
        print("OK" if report["ok"] else "OVER BUDGET")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

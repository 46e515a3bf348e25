"""A private attribute ``upstream.py`` writes onto vLLM's objects is read nowhere else unchecked.

``upstream.py`` sets a few of vLLM's private attributes (``runner._moe_model``,
``impl._use_flashinfer_concat_mla_k``). Reading one elsewhere would depend on
vLLM's private name outside the declared contract; this scan of
``ascend_kernel/`` and ``plugins/`` fails on any such read (the contract test's
scan skips names the project defines, which these are once upstream.py sets them).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "ascend_kernel" / "upstream.py"


def _written() -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(CONTRACT.read_text())):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr.startswith("_"):
                    names.add(target.attr)
    return names


def test_upstream_writes_some_private_attributes():
    assert {"_moe_model", "_use_flashinfer_concat_mla_k"} <= _written()


def test_no_other_module_reads_them():
    written = _written()
    reads = []
    for path in [p for d in ("ascend_kernel", "plugins") for p in (ROOT / d).rglob("*.py") if p != CONTRACT]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in written:
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Constant) and node.value in written:
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not reads, f"read outside ascend_kernel/upstream.py (add an accessor there): {reads}"

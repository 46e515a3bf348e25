"""The kernel package holds only the kernel: the size budget and the layering that tools/core_budget.py checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "core_budget.py"
spec = importlib.util.spec_from_file_location("core_budget", TOOL)
core_budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core_budget)


def test_counter_skips_docstrings_comments_and_blank_lines():
    source = '''"""Module
docstring."""

# a comment
import os  # trailing comment


def f(x):
    """Function docstring."""
    y = (x +
         1)
    return "not a docstring"
'''
    # import, def, two lines of the assignment, return
    assert core_budget.code_lines(source) == 5


def test_upward_imports_are_found_and_siblings_are_not():
    source = "import ascend_kernel.cli.main\nfrom ascend_kernel.models import tiny\nfrom ascend_kernel.modelsx import y\n" \
             "from ascend_kernel import settings\nfrom . import cli\n"
    assert core_budget.upward_imports(source) == ["ascend_kernel.cli.main", "ascend_kernel.models"]


def test_the_core_is_within_its_budget_and_imports_nothing_above_it():
    report = core_budget.measure()
    assert not report["upward_imports"], report["upward_imports"]
    assert not report["too_long"], report["too_long"]
    assert report["code_lines"] <= core_budget.MAX_CODE_LINES, report["code_lines"]
    assert not any(name.split("/")[1] in core_budget.NOT_CORE for name in report["files"])
    assert "ascend_kernel/kernel.py" in report["files"] and "ascend_kernel/runner/kernel_runner.py" in report["files"]


def test_the_readme_command_runs():
    proc = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("OK")

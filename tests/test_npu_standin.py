"""tests/npu (the NPU providers on the stand-in NPU) in a pytest process of its own: its device is process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_the_npu_providers_pass_on_the_standin_device():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "npu")],
                          capture_output=True, text=True, timeout=600, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout

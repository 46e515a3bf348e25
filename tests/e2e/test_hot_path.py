"""The decode loop makes no pluggy calls: every per-step choice is a bound method."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, clean_env, run_script

pytestmark = pytest.mark.e2e


def test_no_pluggy_in_decode_loop(tiny_llama):
    proc = run_script(REPO / "tests" / "e2e" / "scripts" / "count_hook_calls.py", [str(tiny_llama), "8"],
                      clean_env(ASCEND_KERNEL_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["generated"] == [8, 8]
    assert result["steps"] >= 8  # the monitored window really covered decode steps
    assert result["probe_calls"] == ["ascend_kernel_samplers"]  # the monitor works
    assert result["decode_hook_calls"] == []

"""An engine leaves the process as it found it, except for what it records.

The kernel changes a few things every caller in a process sees (the list:
docs/architecture.md, "Process-wide changes"): vLLM classes it builds its own
modules in place of (the SFA indexer, the MLA layer that orders its inputs
after the indexer), Dynamo's recompile limit while cpu-graph compiles its
artifacts, the Mooncake worker class and torch's device index while a
connector is built, torch's default dtype while an int8 linear kernel is
built, ``torch.Event`` and the current stream while EPLB moves experts (in
TP=2 workers: tests/e2e/test_eplb.py reads them there). Each is scoped to the
work that needs it. What must last (an environment variable for the engine
processes, the worker and executor classes in vLLM's config, the log-record
factory that writes a kernel error as one paragraph) is a recorded config change.

A tiny DeepSeek-V3.2 model (SFA backend: the module swaps) is served by
``ascend-kernel generate`` in-process under cpu-graph (the recompile limit);
afterwards every watched global is the object it was, every environment
variable the kernel's own code wrote (vLLM and torch write their own) is one
of its recorded config changes, and the log-record factory found is still
underneath the wrappers (the kernel's once, recorded). What the child had in its environment
is read in the child, not in this test's process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import ENGINE_TIMEOUT_S, REPO, clean_env


@pytest.fixture(scope="module")
def tiny_v32(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("deepseek_v32", tmp_path_factory.mktemp("dsv32") / "deepseek_v32")


@pytest.mark.parametrize("capture_mode", ["piecewise", "full_decode_only"])
def test_globals_are_back_or_recorded(tiny_v32, tmp_path, capture_mode):
    out = tmp_path / "globals.json"
    script = REPO / "tests" / "e2e" / "scripts" / "process_globals.py"
    proc = subprocess.run([sys.executable, str(script), str(tiny_v32), capture_mode, str(out)], cwd=REPO,
                          env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), capture_output=True, text=True,
                          timeout=ENGINE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["rc"] == 0
    # ``generate --json`` writes one JSON document on stdout, nothing before or after: the engine's own output
    # went to stderr (under Ray its workers' lines would too)
    assert json.loads(proc.stdout)["outputs"], "the generate document is the script's stdout"
    assert proc.stderr, "the engine's log lines are on stderr"
    changed = [name for name, same in result["same"].items() if not same]
    assert not changed, f"left changed after the engine: {changed}"
    recorded = set(result["config_changes"])
    assert {"parallel_config.worker_cls"} <= recorded, recorded
    unrecorded = [w for w in result["kernel_env_writes"] if f"env.{w.split()[0]}" not in recorded]
    assert not unrecorded, f"environment variables the kernel wrote without a recorded config change: {unrecorded}"
    # the log-record factory found is still underneath (wrapped, by vLLM and once by the kernel), and recorded
    assert result["record_factory_found_kept"] and result["record_factory_kernel_wrappers"] == 1, result
    assert "logging.log_record_factory" in recorded, recorded
    if capture_mode == "piecewise":  # the one variable the graph plugin sets for the engine processes, unless set
        if "VLLM_USE_AOT_COMPILE" in result["env_before"]:  # the child's own environment had it: left alone
            assert not any(w.startswith("VLLM_USE_AOT_COMPILE ") for w in result["kernel_env_writes"])
        else:
            assert "env.VLLM_USE_AOT_COMPILE" in recorded, recorded

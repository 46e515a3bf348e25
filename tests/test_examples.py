"""examples/ak-example-plugin, end to end: installed into a fresh environment, checked by the kit, its tests run.

The environment is a temporary venv created with ``--system-site-packages``
that also sees this project's ``.venv`` (torch, vLLM, pytest, ascend-kernel):
a venv made from a venv's interpreter inherits the *base* interpreter's
site-packages, not the parent venv's, so a ``.pth`` file adds the running
environment's site-packages as a site directory (its own ``.pth`` files, the
editable ascend-kernel install among them, are processed too). The example is
installed from a copy (setuptools writes ``build/`` and ``*.egg-info`` beside
the sources) with ``pip install --no-deps --no-build-isolation --no-index``,
so nothing is downloaded and nothing but the example lands in the venv. Then,
with that venv's interpreter: ``ascend-kernel conformance --plugin example``
and the example's own tests (which use the kit's pytest plugin).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ak-example-plugin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_") and k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def example_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the venv's python, the installed example's source copy)."""
    base = tmp_path_factory.mktemp("example")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=base).stdout.strip())
    parent = sysconfig.get_paths()["purelib"]
    (site / "_ascend_kernel_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    source = base / "ak-example-plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                                     ".pytest_cache"))
    proc = _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                 str(source)], cwd=base)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return python, source


def test_example_is_installed_only_in_its_venv(example_venv):
    python, _ = example_venv
    proc = _run([str(python), "-c", "import ak_example_plugin, vllm, torch; print(ak_example_plugin.__file__)"],
                cwd=python.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(python.parents[1]) in proc.stdout  # the installed copy, not the sources
    assert subprocess.run([sys.executable, "-c", "import ak_example_plugin"], capture_output=True, env=_env(),
                          check=False).returncode != 0  # this environment is untouched


def test_conformance_cli_passes_the_example(example_venv, tmp_path_factory):
    python, source = example_venv
    cache = tmp_path_factory.getbasetemp() / "kit-cache"
    proc = _run([str(python), "-m", "ascend_kernel.cli.main", "conformance", "--plugin", "example", "--json",
                 "--cache-dir", str(cache)], cwd=source)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = {(r["implementation"], r["contract"]): r for r in report["results"]}
    assert {r["plugin"] for r in report["results"]} == {"example"}
    assert {c for (impl, c), r in rows.items() if impl == "coarse" and r["status"] == "pass"} == {
        "builds", "interface", "state-for-every-batch", "prefill-flag"}
    assert report["ok"] and report["counts"]["fail"] == 0
    assert "Decode" in rows[("coarse", "state-for-every-batch")]["reason"]


def test_example_own_tests_pass_through_the_pytest_plugin(example_venv, tmp_path_factory):
    python, source = example_venv
    cache = tmp_path_factory.getbasetemp() / "kit-cache"
    # the option's value joined by "=": a separate path argument would take part in pytest's rootdir search
    proc = _run([str(python), "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--ascend-kernel-cache-dir={cache}"],
                cwd=source)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "test_each_implementation_conforms[example:attention_state:coarse] PASSED" in out
    assert "test_the_whole_plugin PASSED" in out
    assert f"rootdir: {source}" in out
    assert "8 passed" in out  # the rule's 6 rows and the 2 conformance tests

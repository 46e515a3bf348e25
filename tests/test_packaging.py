"""The wheel holds every module of the source tree, under its installed name, and every entry point resolves.

The wheel is built from a copy of the working tree (setuptools' ``build/``
folder keeps files of earlier builds, which would hide a missing module).
"""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: source folder -> installed package (pyproject.toml: [tool.setuptools] package-dir)
INSTALLED_AS = {"ascend_kernel": "ascend_kernel", "plugins": "ascend_kernel_plugins"}
#: not part of the source the build reads
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".hypothesis", "*.pyc")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src") / "ascend-kernel"
    shutil.copytree(REPO, src, ignore=NOT_COPIED)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", str(out)],
        cwd=src, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("ascend_kernel-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _source_modules() -> dict[str, str]:
    """Every .py file under the source folders -> the path it must have in the wheel."""
    expected = {}
    for folder, package in INSTALLED_AS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder)
            if "__pycache__" in rel.parts:
                continue
            expected[path.relative_to(REPO).as_posix()] = "/".join((package, *rel.parts))
    return expected


def test_every_source_module_is_in_the_wheel(wheel):
    names = set(wheel.namelist())
    expected = _source_modules()
    assert "ascend_kernel/ops/reference.py" in expected.values()  # the folders the old hand list missed
    assert "ascend_kernel_plugins/attention/ascend/backend.py" in expected.values()
    missing = sorted(f"{src} (as {dst})" for src, dst in expected.items() if dst not in names)
    assert missing == []


def test_wheel_has_only_the_two_packages(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" not in name}
    assert tops == {"ascend_kernel", "ascend_kernel_plugins"}  # never a top-level `plugins` (or `tests`)
    (top_level,) = [n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt")]
    assert set(wheel.read(top_level).decode().split()) == {"ascend_kernel", "ascend_kernel_plugins"}


def _module_file(names: set[str], module: str) -> str | None:
    base = module.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in names), None)


def _top_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_entry_points_name_modules_in_the_wheel(wheel):
    names = set(wheel.namelist())
    (path,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # entry-point names are case-sensitive
    parser.read_string(wheel.read(path).decode())
    groups = {group: dict(parser[group]) for group in parser.sections()}
    assert {"console_scripts", "vllm.platform_plugins", "ascend_kernel.plugins"} <= set(groups)
    assert groups["vllm.platform_plugins"] == {"ascend_kernel": "ascend_kernel:register"}
    assert len(groups["ascend_kernel.plugins"]) >= 10
    problems = []
    for group, entries in groups.items():
        for name, target in entries.items():
            module, _, attr = target.strip().partition(":")
            module = module.strip()
            found = _module_file(names, module)
            if found is None:
                problems.append(f"[{group}] {name} = {target}: module {module} is not in the wheel")
            elif attr and attr.strip().split(".")[0] not in _top_level_names(wheel.read(found).decode()):
                problems.append(f"[{group}] {name} = {target}: {found} defines no {attr.strip()}")
    assert problems == []

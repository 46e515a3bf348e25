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


def test_wheel_ships_the_pep561_markers(wheel):
    assert {"ascend_kernel/py.typed", "ascend_kernel_plugins/py.typed"} <= set(wheel.namelist())


#: Run by the fresh environment's interpreter: imports every module of the installed wheel and loads every
#: entry point of its distribution; prints where each came from as JSON.
_IMPORT_EVERYTHING = r"""
import importlib, importlib.metadata, json, sys
modules = sys.argv[1:]
dist = importlib.metadata.distribution("ascend-kernel")
found = {"dist": str(dist.locate_file("")), "modules": {}, "entry_points": {}, "errors": [],
         "sys_path": sys.path}
for name in modules:
    try:
        found["modules"][name] = importlib.import_module(name).__file__
    except Exception as exc:
        found["errors"].append(f"import {name}: {type(exc).__name__}: {exc}")
for ep in dist.entry_points:
    try:
        obj = ep.load()
        found["entry_points"][f"{ep.group}:{ep.name}"] = getattr(obj, "__file__", None) or \
            sys.modules[getattr(obj, "__module__", ep.module)].__file__
    except Exception as exc:
        found["errors"].append(f"entry point [{ep.group}] {ep.name} = {ep.value}: {type(exc).__name__}: {exc}")
print(json.dumps(found))
"""


def test_installed_wheel_imports_everything_without_the_source_tree(wheel, tmp_path):
    """The built wheel, installed non-editably into a fresh venv, imports and loads on its own.

    The venv gets no packages of its own besides the wheel: the project's
    dependencies (vLLM, torch, pluggy, ...) come from this test's environment,
    added as a plain path, so its .pth files (the editable install's import hook
    among them) are not run. The interpreter starts in an empty directory with
    no PYTHONPATH (isolated mode), so the repository is not on sys.path either:
    every module must come from the fresh venv.
    """
    import json
    import os
    import site
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--quiet", wheel.filename], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    ours = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))  # paths only: no code runs

    modules = sorted({
        (name[:-len("/__init__.py")] if name.endswith("/__init__.py") else name[:-len(".py")]).replace("/", ".")
        for name in wheel.namelist() if name.endswith(".py") and ".dist-info/" not in name
    })
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ASCEND_KERNEL_"))}
    # -I: neither the working directory nor PYTHON* variables reach sys.path
    proc = subprocess.run([str(python), "-I", "-c", _IMPORT_EVERYTHING, *modules], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["errors"] == []
    assert Path(found["dist"]).resolve() == purelib.resolve()  # the wheel's dist-info, not the editable one
    assert str(REPO) not in found["sys_path"] and "" not in found["sys_path"]
    assert sorted(found["modules"]) == modules and len(modules) > 50
    assert sum(key.startswith("ascend_kernel.plugins:") for key in found["entry_points"]) >= 10
    outside = sorted(f"{what} from {path}" for what, path in {**found["modules"], **found["entry_points"]}.items()
                     if not Path(path).resolve().is_relative_to(purelib.resolve()))
    assert outside == []

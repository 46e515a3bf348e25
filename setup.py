"""Package list for setuptools; every other piece of metadata is in pyproject.toml.

``[tool.setuptools.packages.find]`` names packages after their folders, so it
cannot install ``plugins/`` as ``ascend_kernel_plugins``; a hand-written list
silently leaves new subpackages out of the wheel. The list is computed here
instead: every folder that holds Python files, below each entry of
``[tool.setuptools] package-dir`` in pyproject.toml (``plugins/`` installs as
``ascend_kernel_plugins``, never as a top-level ``plugins``).
tests/test_packaging.py builds the wheel and checks that nothing is missing.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _packages(package_dir: dict[str, str]) -> list[str]:
    names = []
    for package, folder in sorted(package_dir.items()):
        top = ROOT / folder
        for path in sorted([top, *(p for p in top.rglob("*") if p.is_dir())]):
            rel = path.relative_to(top).parts
            if "__pycache__" in rel or any(part.startswith(".") for part in rel):
                continue
            if any(p.is_file() for p in path.glob("*.py")):
                names.append(".".join((package, *rel)))
    return names


_PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

setup(packages=_packages(_PACKAGE_DIR))

"""Model directories written once and read by many: a marker file says what was built, renames make it atomic.

The tiny random models and the prepared real model are both built into a
temporary sibling directory, marked with a JSON file naming what was built
(arch, seed, recipe...), and renamed into place, so a reader never sees half a
model, a re-run finds the marker and returns at once, and two processes
building the same model concurrently both end with one good copy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


def read_marker(path: Path, marker_name: str) -> dict[str, Any] | None:
    """The marker of a finished model at ``path``, or None when there is none (or it is not a JSON object)."""
    try:
        marker = json.loads((path / marker_name).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def normalise_permissions(path: Path) -> None:
    """Ordinary permissions for the directory and its files (mkdtemp and some writers use owner-only modes)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    for child in path.iterdir():
        child.chmod(0o666 & ~umask)


def move_into_place(tmp: Path, out: Path, wanted: dict[str, Any], marker_name: str) -> None:
    """Rename ``tmp`` to ``out``; an older marked model there is moved aside first.

    If another process finished the same model first, its copy is kept.
    """
    old: Path | None = None
    if out.exists() and read_marker(out, marker_name) is not None:
        old = out.parent / f".{out.name}.old-{os.getpid()}-{id(tmp)}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)  # replaces an empty directory atomically on POSIX
    except OSError:
        if read_marker(out, marker_name) != wanted:
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def build_marked(out: Path, wanted: dict[str, Any], marker_name: str, build: Callable[[Path], None]) -> Path:
    """Run ``build`` into a temporary sibling of ``out``, mark it with ``wanted`` and move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        build(tmp)
        (tmp / marker_name).write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
        normalise_permissions(tmp)
        move_into_place(tmp, out, wanted, marker_name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

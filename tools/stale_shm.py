"""Remove vLLM-CPU's shared-memory segments that no running process maps (left behind by killed runs).

vLLM-CPU names a TP group's segment after the port of its rendezvous address
(``<port>-tp:0-[0-1]-cpushm_<rank>``: ``VLLM_DIST_IDENT`` in vLLM's
``cpu_worker.py``) and creates it exclusively, so a segment left by a killed
run makes a later run that draws the same port fail at start-up ("create shm
in SHMManager failed. errno: 17"). The suite kills engines on purpose (the
fault tests), so segments pile up on a host (126 here after a day of runs)
and each new TP group's chance of drawing a stale port grows: seen once in a
fresh-clone run, the Ray TP=2 server. ``make test`` runs this first, while no
engine of its own runs; a segment a live process maps is never touched.
"""

from __future__ import annotations

import sys
from pathlib import Path

SHM = Path("/dev/shm")
PATTERN = "*-cpushm_*"


def mapped_segments() -> set[str]:
    """Paths under /dev/shm that some live process has mapped (those readable to us)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:  # the process ended, or is not ours to read
            continue
        mapped.update(line.split(None, 5)[-1].removesuffix(" (deleted)") for line in text.splitlines()
                      if "/dev/shm/" in line)
    return mapped


def main() -> int:
    if not SHM.is_dir():
        return 0
    in_use = mapped_segments()
    removed = 0
    for segment in SHM.glob(PATTERN):
        if str(segment) not in in_use:
            try:
                segment.unlink()
                removed += 1
            except OSError:  # another user's, or gone already
                pass
    if removed:
        print(f"stale_shm: removed {removed} vLLM-CPU shared-memory segment(s) no process maps", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

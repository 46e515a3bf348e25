"""One benchmark engine in a process of its own, driven over a line-per-request JSON pipe.

The graph and fusion benchmarks each time several engines of one model (a platform is fixed per process),
side by side, in one run: each engine is this script's ``--worker`` child, which answers a ``hello`` line
when its engine is built and one line per timed block. Imported by sibling scripts (run as
``python bench/NAME.py``, so this folder is on ``sys.path``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


class EnginePipe:
    """The worker process of one engine: ``block(batch, tokens)`` sends a request and returns its answer."""

    def __init__(self, script: str, label: str, worker_args: list[str], env: dict[str, str] | None = None,
                 stderr: Any = subprocess.DEVNULL) -> None:
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker", *worker_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            cwd=Path(__file__).resolve().parents[1], env=env)
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine {self.label} exited (rc {self.proc.wait()})")
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request line, return the worker's answer line."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def block(self, batch: int, tokens: int) -> dict[str, Any]:
        return self.ask({"batch": batch, "tokens": tokens})

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)

"""Where the CLI's output goes: the engine's chatter on stderr, the document (text or ``--json``) on stdout."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from typing import Any


@contextlib.contextmanager
def engine_output_to_stderr():
    """vLLM and its engine/worker processes log to stdout; keep stdout for our own output.

    Both the Python-level stream and file descriptor 1 (inherited by child
    processes) point at stderr while the engine lives.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class JsonStdout:
    """``--json``: standard output carries the JSON document and nothing else, under every executor.

    From :meth:`claim` on, file descriptor 1 and ``sys.stdout`` point at
    stderr: the engine, its child processes (which inherit fd 1) and threads
    that outlive the engine (Ray's driver prints its workers' log lines as
    they arrive, also after the engine is shut down) all write there. The real
    stdout is kept aside, and :meth:`write` puts the document on it. On the
    command line (``keep``) the redirection stays until the process exits;
    for in-process callers of :func:`main` :meth:`write` first points fd 1
    and ``sys.stdout`` back (their stdout may be a capture of the stream).
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.fd: int | None = None
        self._saved_stream: Any = None

    def claim(self) -> "JsonStdout":
        sys.stdout.flush()
        self.fd = os.dup(1)
        os.dup2(2, 1)
        self._saved_stream, sys.stdout = sys.stdout, sys.stderr
        return self

    def write(self, text: str) -> None:
        if not self.keep:
            self.release()
        if self.fd is None:
            print(text)
            return
        data = (text + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def release(self) -> None:
        if self.fd is None:
            return
        sys.stdout.flush()
        os.dup2(self.fd, 1)
        os.close(self.fd)
        self.fd = None
        sys.stdout = self._saved_stream


def emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    if not args.json:
        print(text)
        return
    out = getattr(args, "json_stdout", None)
    document = json.dumps(payload, indent=2, default=str)
    if out is None:
        print(document)
    else:
        out.write(document)


def paragraphs(message: str) -> str:
    """An error message for a terminal: each paragraph (blank-line separated) folded onto one line of its own.

    A single problem stays one line; a message listing several (each refused vllm-ascend key is a paragraph) keeps
    one line per problem instead of running them together."""
    folded = (" ".join(part.split()) for part in re.split(r"\n\s*\n", message))
    return "\n".join(part for part in folded if part)

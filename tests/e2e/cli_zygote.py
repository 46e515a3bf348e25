"""Run ``ascend-kernel`` commands in processes forked from one that already imported the stack.

Each end-to-end scenario runs the CLI in a fresh process, exactly as a user
would, because vLLM fixes its platform per process. About two thirds of a
tiny-model run is importing torch, transformers and vLLM (some 10 s of 16 s
here), so the suite spent most of its time importing. A *zygote* imports them
once, with the platform a group of commands needs already resolved (the
kernel's CPU platform, or stock vLLM's), and then forks one child per command.
The child sets the command's working directory, environment and argv, points
its stdout/stderr at files, and runs ``python -m ascend_kernel.cli.main``
through :func:`runpy.run_module`: the same code path as the subprocess, minus
the imports. A test's helper script (tests/e2e/scripts/) runs the same way
through :func:`runpy.run_path`, as ``python SCRIPT ARGS`` would. Nothing else
is shared: every command still gets its own process, engine, kernel and exit
status.

Protocol (one JSON object per line): the client writes ``{"argv", "env",
"cwd", "stdout", "stderr"}`` (and ``"script"`` for a script); the zygote answers ``{"pid"}`` when the child
starts and ``{"rc"}`` when it ends. ``ASCEND_KERNEL_TEST_ZYGOTE=0`` turns the
whole thing off (every command a plain subprocess).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

#: the platform each zygote resolves before forking: the kernel's CPU fallback, or stock vLLM-CPU
FLAVOURS = {"kernel": {"ASCEND_KERNEL_DEVICE": "cpu"}, "stock": {"ASCEND_KERNEL_DEVICE": "auto"}}


# -- the zygote (runs as a script) -----------------------------------------------------------------


def _preload(flavour: str) -> None:
    """Import the stack and resolve the flavour's platform; fail loudly if it is not the one wanted."""
    os.environ.update(FLAVOURS[flavour])
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vllm.platforms
    from vllm import LLM  # noqa: F401

    import ascend_kernel.cli.engine  # noqa: F401
    import ascend_kernel.cli.main  # noqa: F401

    platform = type(vllm.platforms.current_platform).__module__
    if (flavour == "kernel") != platform.startswith("ascend_kernel."):
        raise SystemExit(f"zygote {flavour}: resolved platform {platform}")
    if threading.active_count() != 1:
        raise SystemExit(f"zygote {flavour}: {threading.active_count()} threads after import; forking is unsafe")


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the command's process and run the CLI module as ``python -m`` would."""
    import runpy

    os.setsid()  # its own process group, so a timeout kills the command and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request["cwd"])
    inherited = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONPATH", "") != inherited:
        # the interpreter reads PYTHONPATH only at start-up: put the command's entries first, as it would
        import importlib

        sys.path[1:1] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        importlib.invalidate_caches()
    script = request.get("script")
    sys.argv = [script or sys.argv[0], *request["argv"]]
    if script:
        sys.path.insert(0, os.path.dirname(script))  # as ``python SCRIPT`` would
    code: Any = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("ascend_kernel.cli.main", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback on stderr, status 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def serve(flavour: str) -> None:
    _preload(flavour)
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    print(json.dumps({"ready": flavour}), file=channel)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=channel)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=channel)


# -- the client (used by the tests) ----------------------------------------------------------------


class Zygote:
    """One zygote process of a flavour; runs commands one at a time."""

    def __init__(self, flavour: str, env: dict[str, str], cwd: Path) -> None:
        self.flavour = flavour
        self.proc = subprocess.Popen([sys.executable, __file__, flavour], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=cwd, env={**env, **FLAVOURS[flavour]},
                                     bufsize=1)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"the {flavour} zygote did not start (exit {self.proc.wait()})")
        self.lock = threading.Lock()

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
            script: Path | None = None) -> subprocess.CompletedProcess:
        """``ascend-kernel ARGV`` in a forked child; with ``script``, ``python SCRIPT ARGV`` instead."""
        with self.lock, tempfile.TemporaryDirectory(prefix="ak-zygote-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
            if script is not None:
                request["script"] = str(script)
            self.proc.stdin.write(json.dumps(request) + "\n")
            pid = json.loads(self.proc.stdout.readline())["pid"]
            timer = threading.Timer(timeout, lambda: _kill_group(pid))
            timer.start()
            try:
                line = self.proc.stdout.readline()
            finally:
                timer.cancel()
            if not line:
                raise RuntimeError(f"the {self.flavour} zygote died running {argv}")
            rc = json.loads(line)["rc"]
            return subprocess.CompletedProcess(argv, rc, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def flavour_for(argv: list[str], env: dict[str, str]) -> str | None:
    """Which zygote can run this command (None: a plain subprocess).

    Only engine commands gain, and only those whose platform is the zygote's:
    ``--stock`` runs stock vLLM; everything else on this host resolves to the
    kernel's CPU fallback unless the command asks for another device.
    """
    if not argv or argv[0] not in ("generate", "explain"):
        return None
    if "--stock" in argv:
        return "stock"
    return "kernel" if env.get("ASCEND_KERNEL_DEVICE", "cpu").lower() in ("cpu", "auto") else None


if __name__ == "__main__":
    serve(sys.argv[1])

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

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's reaper is not the command's
    os.setsid()  # its own process group, so a timeout kills the command and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if fd == 2 and path == request["stdout"]:  # one log for both, as ``stderr=STDOUT``
            os.dup2(1, 2)
            continue
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


#: detached children (servers) still running: pid -> the file their exit status goes to
_detached: dict[int, str] = {}


def _reap_detached(signum: int, frame: Any) -> None:
    """SIGCHLD: write each ended detached child's exit status to its file (only those: a command's own child
    is waited for by the loop)."""
    for pid, rc_file in list(_detached.items()):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            del _detached[pid]
            Path(rc_file + ".tmp").write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(rc_file + ".tmp", rc_file)


def serve(flavour: str) -> None:
    _preload(flavour)
    signal.signal(signal.SIGCHLD, _reap_detached)
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    print(json.dumps({"ready": flavour}), file=channel)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        if request.get("rc_file"):  # detached (a server): its status goes to the file when it ends
            _detached[pid] = request["rc_file"]
            print(json.dumps({"pid": pid}), file=channel)
            _reap_detached(signal.SIGCHLD, None)  # it may have ended already
            continue
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

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> "ForkedProcess":
        """``ascend-kernel ARGV`` in a forked child that runs on its own (a server), stdout and stderr to
        ``log_path``; returns at once with a handle like ``subprocess.Popen``'s."""
        rc_file = str(log_path) + ".exit-status"
        Path(rc_file).unlink(missing_ok=True)
        with self.lock:
            request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(log_path),
                       "stderr": str(log_path), "rc_file": rc_file}
            self.proc.stdin.write(json.dumps(request) + "\n")
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.flavour} zygote died starting {argv}")
        return ForkedProcess(json.loads(line)["pid"], argv, Path(rc_file))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


class ForkedProcess:
    """A detached child of a zygote, handled as a ``subprocess.Popen`` (its exit status comes from the file the
    zygote writes when it ends: it is the zygote's child, not this process's)."""

    def __init__(self, pid: int, args: list[str], rc_file: Path) -> None:
        self.pid, self.args, self.rc_file = pid, args, rc_file
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.rc_file.exists():
            self.returncode = int(self.rc_file.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.1)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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

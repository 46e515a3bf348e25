"""The kernel's live report in vLLM's OpenAI-compatible server: ``GET /ascend-kernel/report``.

vLLM 0.32 builds its FastAPI app inside ``build_and_serve`` and offers two
ways in without patching it: endpoint plugins (entry points that load only
when named in ``VLLM_PLUGINS``, which would then also filter the platform
plugins) and ``--middleware IMPORT.PATH`` (any ASGI middleware class, passed
through to every API-server process by import path). ``ascend-kernel serve``
uses the second: it adds :data:`MIDDLEWARE` to vLLM's ``--middleware`` list,
and this middleware answers the one path itself, passing every other request
on. ``python -m vllm.entrypoints.openai.api_server ... --middleware
ascend_kernel.cli.serving.KernelReportMiddleware`` (with the kernel's platform
active) gets the same route; without the kernel the route answers 404.

The report is the engine's own: ``collective_rpc("ascend_kernel_report")``
through the server's engine client (vLLM's ``AsyncLLM``), answered by every
worker between steps: decision records, config changes, KV-cache
allocation, the step trace (per rank under ``ranks``), ops provider. With
data parallelism the workers of every engine answer (:func:`worker_reports`).

vLLM's API-key check (``--api-key`` / ``VLLM_API_KEY``) only guards the
``/v1``-style prefixes, and this middleware runs in front of it, so it checks
the key itself with vLLM's own verifier: without a valid ``Authorization:
Bearer KEY`` the answer is 401 ``{"error": "Unauthorized"}``, as for ``/v1``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_PATH = "/ascend-kernel/report"
MIDDLEWARE = "ascend_kernel.cli.serving.KernelReportMiddleware"
RPC_TIMEOUT_S = 60.0  # the default of ASCEND_KERNEL_REPORT_RPC_TIMEOUT_S (the setting is what the route uses)


def _json(status: int, payload: Any) -> Any:
    from starlette.responses import Response

    return Response(json.dumps(payload, default=str), status_code=status, media_type="application/json")


def api_tokens(args: Any) -> list[str]:
    """The keys vLLM's server accepts (``--api-key`` wins over ``VLLM_API_KEY``, as in vLLM's middleware setup)."""
    from vllm import envs

    return [key for key in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if key]


async def worker_reports(engine_client: Any) -> list[dict[str, Any]]:
    """``ascend_kernel_report`` of every worker of every engine this server drives, in DP-rank order.

    With data parallelism vLLM's ``AsyncLLM.collective_rpc`` sends the call to
    every engine but returns the first engine's answer only (its DP client's
    ``call_utility_async``); the same client's ``call_utility_all_async``
    returns one answer per engine it manages: every DP rank with internal load
    balancing, on this host and on ``--headless`` hosts alike (not the other
    hosts' ranks with ``--data-parallel-hybrid-lb`` or external LB, where each
    API server manages only its own).
    """
    core = getattr(engine_client, "engine_core", None)
    call_all = getattr(core, "call_utility_all_async", None)
    from ascend_kernel.settings import load_settings

    timeout = load_settings().report_rpc_timeout_s
    if call_all is None or len(getattr(core, "core_engines", ())) < 2:
        return list(await engine_client.collective_rpc("ascend_kernel_report", timeout=timeout))
    per_engine = await call_all("collective_rpc", "ascend_kernel_report", timeout, (), None)
    return [report for engine in per_engine for report in engine]


def kernel_not_active(exc: BaseException) -> bool:
    """True when ``exc`` says the workers have no ``ascend_kernel_report`` (stock vLLM workers), and only then."""
    from ascend_kernel.upstream import missing_worker_method

    return missing_worker_method("ascend_kernel_report") in str(exc)


async def report_response(engine_client: Any) -> Any:
    """The report route's answer: 200 with the report; 404 only when the engine's workers are not the
    kernel's; 500 naming what failed otherwise (a worker that raised, a timeout, a report that cannot merge)."""
    from ascend_kernel.cli.engine import merge_worker_reports

    try:
        reports = await worker_reports(engine_client)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON answer that says what it was
        if kernel_not_active(exc):
            return _json(404, {"error": "ascend-kernel is not active in this server's engine "
                                        f"(its workers have no ascend_kernel_report: {exc})"})
        return _json(500, {"error": f"the kernel's report failed: {type(exc).__name__}: {exc}"})
    try:
        merged = merge_worker_reports(reports)
    except Exception as exc:  # noqa: BLE001
        return _json(500, {"error": f"the workers' reports could not be merged: {type(exc).__name__}: {exc}"})
    return _json(200, merged)


class KernelReportMiddleware:
    """ASGI middleware (vLLM's ``--middleware`` hook) that answers :data:`REPORT_PATH`.

    At the server's start (the ASGI lifespan) it also starts the engine-liveness
    watch of :mod:`ascend_kernel.cli.liveness` where the server drives engines
    on other hosts.
    """

    def __init__(self, app: Any) -> None:
        from ascend_kernel.cli.media import register

        register()  # the kernel's media connector, in every API-server process (``serve`` selects it by name)
        self.app = app
        self._verifier: Any = None  # vLLM's AuthenticationMiddleware, for its token check (built on first use)
        self._tokens_read = False
        self._liveness: Any = None  # the engine-liveness task (False: nothing to watch)
        self._refused: dict[str, str] | None = None  # request options this configuration cannot run (request_checks)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and self._liveness is None:
            # the engine client exists before the server starts; a server with engines on other hosts needs a
            # watch that vLLM lacks (ascend_kernel/cli/liveness.py)
            from ascend_kernel.cli.liveness import start_watch

            self._liveness = start_watch(scope["app"].state) or False
        if scope["type"] == "lifespan" and self._liveness:
            send = self._stop_launcher_after_shutdown(send)
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS"
                or scope["path"].removeprefix(scope.get("root_path", "")) != REPORT_PATH):
            if scope["type"] == "http":
                receive = await self._refuse_or_pass(scope, receive, send)
                if receive is None:
                    return
            await self.app(scope, receive, send)
            return
        response = await self._answer(scope)
        await response(scope, receive, send)

    def _stop_launcher_after_shutdown(self, send: Any) -> Any:
        """``send`` that, once the app's lifespan shutdown is over, stops the node's launcher if the watch failed
        the client (:func:`ascend_kernel.cli.liveness.stop_launcher`: why vLLM's launcher would wait on)."""
        from ascend_kernel.cli.liveness import stop_launcher

        async def sent(message: Any) -> None:
            await send(message)
            if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                stop_launcher(self._liveness)

        return sent

    async def _answer(self, scope: Any) -> Any:
        from starlette.datastructures import Headers

        state = scope["app"].state
        verifier = self._token_verifier(getattr(state, "args", None))
        if verifier is not None and not verifier.verify_token(Headers(scope=scope)):
            return _json(401, {"error": "Unauthorized"})
        if scope.get("method") not in ("GET", "HEAD"):
            return _json(405, {"error": f"{REPORT_PATH} answers GET only"})
        engine_client = getattr(state, "engine_client", None)
        if engine_client is None:
            return _json(503, {"error": "the server has no engine yet"})
        return await report_response(engine_client)

    async def _refuse_or_pass(self, scope: Any, receive: Any, send: Any) -> Any:
        """The ``receive`` to hand on, or None where the request was answered here with a 400."""
        from ascend_kernel.cli import request_checks

        if self._refused is None:
            engine_client = getattr(scope["app"].state, "engine_client", None)
            if engine_client is None:
                return receive  # not started yet: ask again with the next request
            self._refused = request_checks.refused_options(engine_client)
        receive, option, why = await request_checks.check(scope, receive, self._refused)
        if option is None:
            return receive
        await _json(400, request_checks.bad_request(option, why))(scope, receive, send)
        return None

    def _token_verifier(self, args: Any) -> Any:
        if not self._tokens_read:
            tokens = api_tokens(args)
            if tokens:
                from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

                self._verifier = AuthenticationMiddleware(self.app, tokens=tokens)
            self._tokens_read = True
        return self._verifier


# -- a local server process (tests and bench/serve_load.py) -------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, below the OS's ephemeral range when it can be.

    Whoever asks binds the port only later, often after loading a model (an
    API server, a Mooncake bootstrap server). A port the OS picked for a
    ``bind(0)`` is one it hands out again, meanwhile, to any socket asking for
    an ephemeral port (seen: a producer's bootstrap server failing with
    EADDRINUSE while another engine started). Below that range only an explicit
    bind can take it; a random pick there keeps two callers apart.
    """
    import random
    import socket

    low = _ephemeral_range_start()
    pick = random.SystemRandom()
    for _ in range(64):
        port = pick.randrange(max(1024, low // 2), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _ephemeral_range_start() -> int:
    """The first port of the OS's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class LocalServer:
    """An OpenAI-compatible server run as a child process (its own process group), logging to a file.

    ``argv`` is the whole command; ``--host``/``--port`` are appended. Used by
    the serving tests and ``bench/serve_load.py`` for both ``ascend-kernel
    serve`` and stock ``python -m vllm.entrypoints.openai.api_server``.
    """

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Any, *, host: str = "127.0.0.1",
                 port: int | None = None, api_key: str | None = None, new_session: bool = True) -> None:
        from pathlib import Path

        self.host = host
        self.port = port or free_port(host)
        self.argv = [*argv, "--host", host, "--port", str(self.port)]
        self.env = env
        self.log_path = Path(log_path)
        self.api_key = api_key
        #: False: stay in the parent's process group (``serve-pd``: whoever stops the group stops the instances)
        self.new_session = new_session
        self.process: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout_s: float = 600.0) -> "LocalServer":
        """Start and wait until ``/health`` answers 200 (raises with the log's tail if the server dies first)."""
        import time
        import urllib.request

        self.process = self.launch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode} before it was ready; "
                                   f"log tail:\n{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s; log tail:\n{self.log_text()[-4000:]}")

    def launch(self) -> Any:
        """The server's process (a ``subprocess.Popen``, or anything with its ``pid``, ``poll``, ``wait``,
        ``send_signal`` and ``returncode``), its output in the log file; a subclass may start it otherwise."""
        import subprocess

        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            return subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=self.new_session)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (vLLM shuts its engine down), then SIGKILL to the server's own process group if it lingers."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, timeout_s, whole_group=self.new_session)


def stop_process(process: Any, timeout_s: float = 60.0, whole_group: bool = True) -> None:
    """SIGTERM ``process``, wait up to ``timeout_s``, then SIGKILL what is left: its whole process group (a
    server or node started in a session of its own: engine core, workers) or, without one, the process."""
    import os
    import signal
    import subprocess

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    if whole_group:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    elif process.poll() is None:
        process.kill()
    process.wait()

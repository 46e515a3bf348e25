"""``ascend-kernel pd-proxy``: one OpenAI-compatible endpoint in front of prefill and decode instances.

Prefill/decode disaggregation over vLLM's ``MooncakeConnector``: a
``kv_producer`` instance computes a prompt's KV pages, a ``kv_consumer``
instance pulls them and generates. Each request this proxy takes goes

1. to a prefill instance (round-robin), as a copy with ``max_tokens=1``, no
   streaming, and ``kv_transfer_params = {"do_remote_decode": true,
   "do_remote_prefill": false, "transfer_id": <new>}``: the producer computes
   the prompt and holds its pages for the consumer. The kernel's connector
   answers with the ``kv_transfer_params`` a consumer needs (its engine id,
   bootstrap address, the transfer id);
2. then to a decode instance (round-robin), as the client sent it (streamed
   or not) plus those ``kv_transfer_params``: the consumer pulls the pages and
   computes only the prompt's last token before it generates.

The decode instance's answer is the client's answer, byte for byte (SSE
passed through as it arrives). An instance that cannot be reached, a prefill
that fails or answers no transfer parameters, ends the request with an
OpenAI-style error naming the instance, at once; a decode that cannot pull
the pages (the producer died after prefill) fails on the decode instance
within the connector's abort timeout (``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT``)
and its error is passed on. ``GET /pd-proxy/status`` lists the instances and
what each served.

Health. The proxy asks every instance's ``GET /health`` every
``ASCEND_KERNEL_PD_PROXY_HEALTH_INTERVAL_S``; an instance that fails a check,
or that cannot be reached for a request, leaves its role's rotation at once
and comes back when a later check answers 200. The proxy's own ``/health``
answers 200 while every role has a healthy instance, else 503; both bodies
list each instance's state and the reason it was taken out. Timeouts are
settings (``ASCEND_KERNEL_PD_PROXY_*``).

Only the HTTP stack vLLM already brings (Starlette, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

PROG = "ascend-kernel pd-proxy"
ROUTES = ("/v1/completions", "/v1/chat/completions")
STATUS_PATH = "/pd-proxy/status"
#: request headers passed to the instances (the client's key, if the instances check one)
FORWARDED_HEADERS = ("authorization", "x-request-id")


@dataclass
class Instance:
    """One backend server, what it served through this proxy, and whether it is in the rotation."""

    url: str
    role: str
    requests: int = 0
    errors: int = 0
    healthy: bool = True
    #: why it left the rotation (None while healthy)
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "role": self.role, "requests": self.requests, "errors": self.errors,
                "healthy": self.healthy, "reason": self.reason}

    def down(self, reason: str) -> None:
        self.healthy, self.reason = False, reason

    def up(self) -> None:
        self.healthy, self.reason = True, None


@dataclass
class Pool:
    """Round-robin over the healthy instances of one role."""

    instances: list[Instance]
    _turn: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._turn = itertools.count()

    def next(self) -> Instance:
        """The next healthy instance (raises :class:`ProxyError` 503 naming every instance when none is)."""
        for _ in range(len(self.instances)):
            instance = self.instances[next(self._turn) % len(self.instances)]
            if instance.healthy:
                return instance
        role = self.instances[0].role if self.instances else "?"
        raise ProxyError(503, f"no healthy {role} instance: " + "; ".join(
            f"{i.url} ({i.reason})" for i in self.instances))

    def any_healthy(self) -> bool:
        return any(i.healthy for i in self.instances)


class ProxyError(Exception):
    """A request the proxy ends itself: HTTP status and a message naming the instance."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def normalize_url(text: str) -> str:
    """``host:port`` or ``http://host:port[/]`` -> ``http://host:port`` (refuses anything else)."""
    from urllib.parse import urlsplit

    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise argparse.ArgumentTypeError(f"{text!r} is no instance address; give http://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}"


def prefill_body(body: dict[str, Any], transfer_id: str) -> dict[str, Any]:
    """The prefill's copy of a request: one token, not streamed, pages held for a consumer."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}
    return out


def _error(status: int, message: str) -> Any:
    from starlette.responses import JSONResponse

    kind = "ServiceUnavailable" if status == 503 else "BadGateway" if status >= 500 else "BadRequestError"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class PDProxy:
    """The proxy's state and request flow (one instance per app)."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str], timeout_s: float, transport: Any = None,
                 *, connect_timeout_s: float = 10.0, health_interval_s: float = 5.0,
                 health_timeout_s: float = 5.0) -> None:
        self.prefill = Pool([Instance(u, "prefill") for u in prefill])
        self.decode = Pool([Instance(u, "decode") for u in decode])
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.transport = transport  # an httpx transport (tests); None: the network
        self.client: Any = None
        self._watch: Any = None

    async def start(self) -> None:
        import asyncio

        import httpx

        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                                        trust_env=False, transport=self.transport)
        self._watch = asyncio.create_task(self._watch_health())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.client is not None:
            await self.client.aclose()

    def instances(self) -> list[Instance]:
        return [*self.prefill.instances, *self.decode.instances]

    async def check(self, instance: Instance) -> None:
        """One health check: ``GET /health`` answered 200 in time puts ``instance`` in the rotation, else out."""
        try:
            answer = await self.client.get(instance.url + "/health", timeout=self.health_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the instance's
            instance.down(f"health check failed: {type(exc).__name__}: {exc}")
            return
        if answer.status_code == 200:
            instance.up()
        else:
            instance.down(f"health check answered {answer.status_code}")

    async def check_all(self) -> None:
        import asyncio

        await asyncio.gather(*(self.check(i) for i in self.instances()))

    async def _watch_health(self) -> None:
        import asyncio
        import logging

        while True:
            try:
                await self.check_all()
            except Exception:  # noqa: BLE001 - the watch outlives a bad round
                logging.getLogger("ascend_kernel").exception("pd-proxy: health round failed")
            await asyncio.sleep(self.health_interval_s)

    def healthy(self) -> bool:
        """Every role has an instance in the rotation."""
        return self.prefill.any_healthy() and self.decode.any_healthy()

    def status(self) -> dict[str, Any]:
        return {"healthy": self.healthy(), "prefill": [i.as_dict() for i in self.prefill.instances],
                "decode": [i.as_dict() for i in self.decode.instances]}

    async def run_prefill(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """Send the prefill copy; return the consumer's ``kv_transfer_params`` (raises :class:`ProxyError`)."""
        import httpx

        instance = self.prefill.next()
        instance.requests += 1
        try:
            answer = await self.client.post(instance.url + path, json=prefill_body(body, uuid.uuid4().hex),
                                            headers=headers)
        except httpx.HTTPError as exc:
            instance.errors += 1
            _unreachable(instance, exc)
            raise ProxyError(502, f"prefill instance {instance.url} failed: {type(exc).__name__}: {exc}") from exc
        if answer.status_code != 200:
            instance.errors += 1
            raise ProxyError(answer.status_code if answer.status_code < 500 else 502,
                             f"prefill instance {instance.url} answered {answer.status_code}: {_short(answer.text)}")
        try:
            document = answer.json()
        except ValueError as exc:
            instance.errors += 1
            raise ProxyError(502, f"prefill instance {instance.url} answered 200 with no JSON "
                                  f"({exc}): {_short(answer.text)}") from exc
        params = document.get("kv_transfer_params") if isinstance(document, dict) else None
        if not params:
            instance.errors += 1
            raise ProxyError(502, f"prefill instance {instance.url} answered without kv_transfer_params "
                                  "(is it an ascend-kernel serve with a MooncakeConnector kv_producer config?)")
        return params

    async def handle(self, request: Any, path: str) -> Any:
        import httpx
        from starlette.background import BackgroundTask
        from starlette.responses import Response, StreamingResponse

        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(400, f"the request body is no JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        try:
            params = await self.run_prefill(path, body, headers)
            instance = self.decode.next()
        except ProxyError as exc:
            return _error(exc.status, str(exc))
        instance.requests += 1
        upstream = self.client.build_request("POST", instance.url + path, json={**body, "kv_transfer_params": params},
                                             headers=headers)
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            instance.errors += 1
            _unreachable(instance, exc)
            return _error(502, f"decode instance {instance.url} failed: {type(exc).__name__}: {exc}")
        if answer.status_code != 200:
            instance.errors += 1
        media = answer.headers.get("content-type", "application/json")
        if not body.get("stream") or answer.status_code != 200:
            content = await answer.aread()
            await answer.aclose()
            return Response(content, status_code=answer.status_code, media_type=media)
        return StreamingResponse(answer.aiter_raw(), status_code=200, media_type=media,
                                 background=BackgroundTask(answer.aclose))


def _unreachable(instance: Instance, exc: Exception) -> None:
    """A request could not reach ``instance`` (no connection): out of the rotation until a health check passes."""
    import httpx

    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)):
        instance.down(f"unreachable for a request: {type(exc).__name__}: {exc}")


def build_app(prefill: Sequence[str], decode: Sequence[str], timeout_s: float | None = None,
              transport: Any = None, settings: Any = None) -> Any:
    """The proxy's ASGI app (Starlette, under vLLM's FastAPI); ``transport`` replaces the network (tests).

    Timeouts and the health interval come from ``settings`` (the kernel's,
    read from the environment when None); ``timeout_s`` overrides the request timeout.
    """
    import contextlib

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    if settings is None:
        from ascend_kernel.settings import load_settings

        settings = load_settings()
    proxy = PDProxy(prefill, decode, timeout_s if timeout_s is not None else settings.pd_proxy_timeout_s, transport,
                    connect_timeout_s=settings.pd_proxy_connect_timeout_s,
                    health_interval_s=settings.pd_proxy_health_interval_s,
                    health_timeout_s=settings.pd_proxy_health_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        await proxy.start()
        await proxy.check_all()  # the rotation starts from what the instances answer now
        yield
        await proxy.close()

    async def completions(request: Any) -> Any:
        return await proxy.handle(request, "/v1/completions")

    async def chat(request: Any) -> Any:
        return await proxy.handle(request, "/v1/chat/completions")

    async def models(request: Any) -> Any:
        import httpx

        try:
            instance = proxy.decode.next()
        except ProxyError as exc:
            return _error(exc.status, str(exc))
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        try:
            answer = await proxy.client.get(instance.url + "/v1/models", headers=headers)
        except httpx.HTTPError as exc:
            _unreachable(instance, exc)
            return _error(502, f"decode instance {instance.url} failed: {type(exc).__name__}: {exc}")
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    async def health(request: Any) -> Any:
        """200 while every role has a healthy instance, else 503; the body lists every instance's state."""
        status = proxy.status()
        return JSONResponse(status, status_code=200 if status["healthy"] else 503)

    async def status(request: Any) -> Any:
        return JSONResponse(proxy.status())

    app = Starlette(lifespan=lifespan, routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route(STATUS_PATH, status, methods=["GET"]),
    ])
    app.state.proxy = proxy
    return app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="OpenAI-compatible proxy for prefill/decode disaggregation over vLLM's "
        "MooncakeConnector: each request is prefilled on a kv_producer instance, then decoded on a kv_consumer "
        "instance with the transfer parameters the prefill returned (round-robin over each role).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", type=normalize_url, required=True, metavar="URL",
                        help="a kv_producer instance, http://HOST:PORT (repeatable)")
    parser.add_argument("--decode", action="append", type=normalize_url, required=True, metavar="URL",
                        help="a kv_consumer instance, http://HOST:PORT (repeatable)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds an instance may take to answer (default: ASCEND_KERNEL_PD_PROXY_TIMEOUT_S, 600)")
    return parser


def serve_proxy(prefill: Sequence[str], decode: Sequence[str], host: str, port: int,
                timeout_s: float | None = None) -> None:
    """Run the proxy until interrupted (blocks)."""
    import uvicorn

    print(f"{PROG}: http://{host}:{port} -> prefill {', '.join(prefill)}; decode {', '.join(decode)}",
          file=sys.stderr, flush=True)
    uvicorn.run(build_app(prefill, decode, timeout_s), host=host, port=port, log_level="warning")


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    serve_proxy(args.prefill, args.decode, args.host, args.port, args.timeout)
    return 0

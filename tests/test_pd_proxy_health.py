"""pd-proxy health against real HTTP servers on 127.0.0.1: a dead instance leaves the rotation, comes back when healthy.

The instances are minimal real servers (``http.server`` in threads, on ports
of their own) that answer ``/health`` and ``/v1/completions`` as a producer
or a consumer; stopping one closes its port, starting it again reopens the
same port. The proxy is the real app, its health watch on a short interval.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from starlette.testclient import TestClient

from ascend_kernel.cli.pd_proxy import build_app
from ascend_kernel.cli.serving import free_port
from ascend_kernel.settings import load_settings

FAST = load_settings({"ascend_kernel": {"pd_proxy_health_interval_s": 0.1, "pd_proxy_health_timeout_s": 2.0,
                                        "pd_proxy_timeout_s": 10.0}})


class Server:
    """One instance: a real HTTP server on 127.0.0.1 that can be stopped and started again on its port."""

    def __init__(self, role: str, prefill_body: bytes | None = None) -> None:
        self.role, self.port, self.prefill_body = role, free_port(), prefill_body
        self.url = f"http://127.0.0.1:{self.port}"
        self.served = 0
        self.httpd: ThreadingHTTPServer | None = None

    def start(self) -> "Server":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, b"") if self.path == "/health" else self._send(404, b"{}")

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.served += 1
                if server.role == "prefill":
                    body = server.prefill_body if server.prefill_body is not None else json.dumps(
                        {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": server.url}}).encode()
                    self._send(200, body)
                else:
                    self._send(200, json.dumps({"decoded_by": server.url,
                                                "with": request["kv_transfer_params"]}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


@pytest.fixture
def servers():
    started: list[Server] = []

    def make(role: str, **kwargs) -> Server:
        started.append(Server(role, **kwargs).start())
        return started[-1]

    yield make
    for server in started:
        server.stop()


def wait_for(client: TestClient, predicate, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.get("/pd-proxy/status").json()
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"the proxy's view did not change in time: {status}"
        time.sleep(0.05)


def healthy(status: dict, url: str) -> bool:
    return next(i for i in status["prefill"] + status["decode"] if i["url"] == url)["healthy"]


def test_a_dead_instance_leaves_the_rotation_and_comes_back(servers):
    prefill, d1, d2 = servers("prefill"), servers("decode"), servers("decode")
    with TestClient(build_app([prefill.url], [d1.url, d2.url], settings=FAST)) as client:
        answer = client.get("/health")
        assert answer.status_code == 200 and answer.json()["healthy"] is True
        decoded = {client.post("/v1/completions", json={"prompt": "p"}).json()["decoded_by"] for _ in range(4)}
        assert decoded == {d1.url, d2.url}, "round-robin over both decode instances"

        d2.stop()
        status = wait_for(client, lambda s: not healthy(s, d2.url))
        assert "health check failed" in next(i for i in status["decode"] if i["url"] == d2.url)["reason"]
        assert client.get("/health").status_code == 200, "every role still has a healthy instance"
        decoded = [client.post("/v1/completions", json={"prompt": "p"}).json()["decoded_by"] for _ in range(4)]
        assert decoded == [d1.url] * 4, "the dead instance is out of the rotation"

        d1.stop()
        wait_for(client, lambda s: not healthy(s, d1.url))
        answer = client.get("/health")
        assert answer.status_code == 503 and answer.json()["healthy"] is False
        failed = client.post("/v1/completions", json={"prompt": "p"})
        assert failed.status_code == 503
        assert d1.url in failed.json()["error"]["message"] and d2.url in failed.json()["error"]["message"]

        d1.start()
        wait_for(client, lambda s: healthy(s, d1.url))
        assert client.get("/health").status_code == 200
        assert client.post("/v1/completions", json={"prompt": "p"}).json()["decoded_by"] == d1.url
        assert not healthy(client.get("/pd-proxy/status").json(), d2.url), "d2 is still down"


def test_a_prefill_answer_that_is_not_json_names_the_instance(servers):
    prefill, decode = servers("prefill", prefill_body=b"<html>proxy error</html>"), servers("decode")
    with TestClient(build_app([prefill.url], [decode.url], settings=FAST)) as client:
        answer = client.post("/v1/completions", json={"prompt": "p"})
    assert answer.status_code == 502
    assert answer.json()["error"]["message"].startswith(f"prefill instance {prefill.url} answered 200 with no JSON")


def test_the_request_timeout_is_a_setting(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_PD_PROXY_TIMEOUT_S", "42")
    app = build_app(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    assert app.state.proxy.timeout_s == 42.0
    assert build_app(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], timeout_s=7).state.proxy.timeout_s == 7

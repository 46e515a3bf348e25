"""``ascend-kernel pd-proxy`` without engines: the request flow against stand-in instances, and its errors.

The stand-ins are one small ASGI app reached through httpx's ASGI transport
(no sockets): it answers as a kv_producer (one token plus the consumer's
``kv_transfer_params``) or a kv_consumer (echoing what it was sent, as JSON
or as server-sent events), chosen by the instance's host name, and records
every body it receives. The proxy under test is the real app.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from ascend_kernel.cli.pd_proxy import build_app, normalize_url, prefill_body
from ascend_kernel.cli.serving import free_port

PREFILL = ["http://prefill-a:1", "http://prefill-b:2"]
DECODE = ["http://decode-a:3"]


class Instances:
    """Stand-in instances: what each was sent, and how a prefill answers."""

    def __init__(self, prefill_answer: Any = None, prefill_status: int = 200) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.prefill_answer = prefill_answer
        self.prefill_status = prefill_status

    async def endpoint(self, request: Any) -> Any:
        host = request.url.hostname
        body = json.loads(await request.body())
        self.seen.append((host, request.url.path, body))
        if host.startswith("prefill"):
            if self.prefill_status != 200:
                return JSONResponse({"error": {"message": "prompt too long"}}, status_code=self.prefill_status)
            params = self.prefill_answer if self.prefill_answer is not None else {
                "do_remote_prefill": True, "transfer_id": body["kv_transfer_params"]["transfer_id"],
                "remote_engine_id": f"engine-{host}", "remote_bootstrap_addr": f"http://{host}:9"}
            return JSONResponse({"choices": [{"text": "x"}], "kv_transfer_params": params})
        if body.get("stream"):
            events = "".join(f"data: {json.dumps({'token': i})}\n\n" for i in range(3)) + "data: [DONE]\n\n"
            return Response(events, media_type="text/event-stream")
        return JSONResponse({"decoded_with": body["kv_transfer_params"], "max_tokens": body["max_tokens"]})

    def transport(self) -> httpx.AsyncBaseTransport:
        app = Starlette(routes=[Route("/v1/completions", self.endpoint, methods=["POST"]),
                                Route("/v1/chat/completions", self.endpoint, methods=["POST"]),
                                Route("/health", lambda request: Response(status_code=200), methods=["GET"])])
        return httpx.ASGITransport(app=app)


def proxy_client(instances: Instances, prefill: list[str] = PREFILL, decode: list[str] = DECODE) -> TestClient:
    return TestClient(build_app(prefill, decode, timeout_s=10, transport=instances.transport()))


def test_prefill_copy_is_one_token_unstreamed_and_asks_for_remote_decode():
    body = {"model": "m", "prompt": "hi", "max_tokens": 9, "max_completion_tokens": 9, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    out = prefill_body(body, "tid")
    assert out == {"model": "m", "prompt": "hi", "max_tokens": 1, "max_completion_tokens": 1, "temperature": 0,
                   "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "tid"}}
    assert body["max_tokens"] == 9 and body["stream"] is True  # the client's request is left as it was


def test_instance_addresses():
    assert normalize_url("127.0.0.1:8100") == "http://127.0.0.1:8100"
    assert normalize_url("http://host:1/") == "http://host:1"
    for bad in ("nohost", "ftp://h:1", "http://h"):
        with pytest.raises(Exception, match="no instance address"):
            normalize_url(bad)


def test_each_request_is_prefilled_then_decoded_with_the_prefills_parameters_round_robin():
    instances = Instances()
    with proxy_client(instances) as client:
        answers = [client.post(path, json={"model": "m", "prompt": "p", "max_tokens": 6, "messages": []}).json()
                   for path in ("/v1/completions", "/v1/chat/completions", "/v1/completions")]
        status = client.get("/pd-proxy/status").json()
    hosts = [host for host, _, _ in instances.seen]
    assert hosts == ["prefill-a", "decode-a", "prefill-b", "decode-a", "prefill-a", "decode-a"]
    for (p_host, p_path, p_body), (_, d_path, d_body), answer in zip(instances.seen[::2], instances.seen[1::2],
                                                                    answers):
        assert p_path == d_path
        assert p_body["max_tokens"] == 1 and p_body["kv_transfer_params"]["do_remote_decode"] is True
        assert d_body["max_tokens"] == 6
        assert answer["decoded_with"]["remote_engine_id"] == f"engine-{p_host}"
        assert answer["decoded_with"]["transfer_id"] == p_body["kv_transfer_params"]["transfer_id"]
    assert len({b["kv_transfer_params"]["transfer_id"] for _, _, b in instances.seen[::2]}) == 3
    assert [i["requests"] for i in status["prefill"]] == [2, 1] and status["decode"][0]["requests"] == 3


def test_a_stream_is_passed_through_from_the_decode_instance():
    instances = Instances()
    with proxy_client(instances) as client:
        answer = client.post("/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 3, "stream": True})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text.count("data: ") == 4 and answer.text.endswith("data: [DONE]\n\n")
    assert "stream" not in instances.seen[0][2] and instances.seen[1][2]["stream"] is True


def test_errors_name_the_instance():
    with proxy_client(Instances(prefill_answer={})) as client:
        answer = client.post("/v1/completions", json={"prompt": "p"})
    assert answer.status_code == 502 and "answered without kv_transfer_params" in answer.json()["error"]["message"]
    with proxy_client(Instances(prefill_status=400)) as client:
        answer = client.post("/v1/completions", json={"prompt": "p"})
        assert answer.status_code == 400 and "prompt too long" in answer.json()["error"]["message"]
        assert client.post("/v1/completions", content=b"{not json").status_code == 400
    dead = f"http://127.0.0.1:{free_port()}"
    with TestClient(build_app([dead], DECODE, timeout_s=5)) as client:
        answer = client.post("/v1/completions", json={"prompt": "p"})
    assert answer.status_code == 503, "a dead instance is out of the rotation from the first health check"
    message = answer.json()["error"]["message"]
    assert message.startswith(f"no healthy prefill instance: {dead} (health check failed: ConnectError")

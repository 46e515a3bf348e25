"""The server's refusal of request options its configuration cannot run (``ascend_kernel/cli/request_checks.py``),
through the kernel's real ASGI middleware in front of a real Starlette app (vLLM's server is one).

The app stands in for vLLM's routes: it echoes the body it received, so a request that passes is shown to reach
the app with its bytes unchanged. The engine client is a holder of the config the check reads (the check reads
nothing else of it)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ascend_kernel.cli.serving import KernelReportMiddleware

LMHEAD_TP = {"finegrained_tp_config": {"lmhead_tensor_parallel_size": 2}}


def _client(additional_config: dict):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"reached": True, "body": (await request.body()).decode()})

    app = Starlette(routes=[Route(p, echo, methods=["POST"]) for p in ("/v1/completions", "/v1/chat/completions",
                                                                        "/v1/embeddings")])
    app.state.engine_client = SimpleNamespace(vllm_config=SimpleNamespace(additional_config=additional_config))
    app.add_middleware(KernelReportMiddleware)
    return TestClient(app)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_under_lm_head_tp_is_a_400_naming_the_option_and_the_setting(path):
    client = _client(LMHEAD_TP)
    answer = client.post(path, json={"model": "m", "prompt": "hi", "prompt_logprobs": 1})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "prompt_logprobs" and error["type"] == "BadRequestError"
    assert "lm-head tensor parallelism of size 2" in error["message"]
    assert "ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE" in error["message"]
    # and the server serves on: the same request without the option reaches the app, its body unchanged
    body = {"model": "m", "prompt": "hi", "logprobs": 2}
    answer = client.post(path, content=json.dumps(body))
    assert answer.status_code == 200 and json.loads(answer.json()["body"]) == body


def test_without_lm_head_tp_nothing_is_refused_and_bodies_pass_unchanged():
    client = _client({})
    body = json.dumps({"model": "m", "prompt": "hi", "prompt_logprobs": 3})
    answer = client.post("/v1/completions", content=body)
    assert answer.status_code == 200 and answer.json()["body"] == body


@pytest.mark.parametrize("value", [None, 0, False])
def test_an_option_set_to_nothing_is_not_asked_for(value):
    answer = _client(LMHEAD_TP).post("/v1/completions", json={"prompt": "hi", "prompt_logprobs": value})
    assert answer.status_code == 200


def test_other_routes_and_bodies_that_are_not_json_pass():
    client = _client(LMHEAD_TP)
    assert client.post("/v1/embeddings", json={"input": "x", "prompt_logprobs": 1}).status_code == 200
    answer = client.post("/v1/completions", content=b"not json")
    assert answer.status_code == 200 and answer.json()["body"] == "not json"


def test_the_kernels_own_setting_spelling_is_read_too(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE", "2")
    answer = _client({}).post("/v1/chat/completions", json={"messages": [], "prompt_logprobs": 1})
    assert answer.status_code == 400

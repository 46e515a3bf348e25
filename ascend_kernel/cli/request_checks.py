"""Requests the server refuses with HTTP 400 before they reach an engine that cannot run them.

Some configurations cannot serve one request option: under lm-head tensor
parallelism (``ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE``, vllm-ascend's
``finegrained_tp_config.lmhead_tensor_parallel_size``) vLLM computes prompt
logprobs with lm-head calls on the requesting DP rank only, collectives the
lm-head group's other ranks never join. The worker refuses such a step
before its first collective (``plugins/layers/lm_head_tp.py``), but an error
raised in a worker ends the engine; here the API server answers the request
with a 400 naming the option and the setting, and serves on.

The check runs in the kernel's ASGI middleware (``serving.KernelReportMiddleware``),
in every API-server process: it reads a generation request's JSON body,
refuses it or hands the same bytes on.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

#: the OpenAI routes whose bodies may carry ``prompt_logprobs``
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


def refused_options(engine_client: Any) -> dict[str, str]:
    """Request options this server's configuration cannot run, each with why (empty: none)."""
    from ascend_kernel.settings import load_settings

    config = getattr(engine_client, "vllm_config", None)
    try:
        settings = load_settings(getattr(config, "additional_config", None) or {})
    except Exception:  # noqa: BLE001 - the engine started with these settings; a failure here refuses nothing
        return {}
    size = int(getattr(settings, "lmhead_tensor_parallel_size", None) or 1)
    if size <= 1:
        return {}
    return {"prompt_logprobs": (
        f"prompt_logprobs cannot run under lm-head tensor parallelism of size {size} "
        "(ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE, vllm-ascend's finegrained_tp_config."
        "lmhead_tensor_parallel_size): vLLM computes the prompt's logits on one DP rank only, where every rank of "
        "the lm-head group must join; send the request without prompt_logprobs, or start the server without "
        "lm-head TP")}


def asked(body: bytes, option: str) -> bool:
    """Whether a JSON request body sets ``option`` (to anything but null, false or 0)."""
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return False  # vLLM answers a body that is not JSON itself
    return isinstance(payload, dict) and payload.get(option) not in (None, False, 0)


async def read_body(receive: Callable[[], Awaitable[dict]]) -> tuple[bytes, list[dict]]:
    """The whole request body, and the ASGI messages it came in (to hand on unchanged)."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), messages


def replay(messages: list[dict], receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """A ``receive`` that gives ``messages`` again, then whatever the connection sends next."""
    pending = list(messages)

    async def again() -> dict:
        return pending.pop(0) if pending else await receive()

    return again


async def check(scope: Any, receive: Any, refused: dict[str, str]) -> tuple[Any, str | None, str | None]:
    """(the ``receive`` to hand on, the refused option, why) for one HTTP request; the option None: let it pass."""
    if not refused or scope.get("method") != "POST" \
            or scope["path"].removeprefix(scope.get("root_path", "")) not in GENERATION_PATHS:
        return receive, None, None
    body, messages = await read_body(receive)
    for option, why in refused.items():
        if asked(body, option):
            return replay(messages, receive), option, why
    return replay(messages, receive), None, None


def bad_request(option: str, why: str) -> dict[str, Any]:
    """vLLM's error body for a 400 (``ErrorResponse``'s fields)."""
    return {"error": {"message": why, "type": "BadRequestError", "param": option, "code": 400}}

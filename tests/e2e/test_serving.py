"""``ascend-kernel serve``: vLLM's OpenAI-compatible server with the kernel, through the official client.

One server for the module (tiny Llama, float32, ``--api-key``), on a free
loopback port, started the way a user starts it (``ascend-kernel serve MODEL
...`` with no ASCEND_KERNEL_* variable: the command picks the device). The
oracle is one offline run of stock vLLM (``ascend-kernel generate --json
--stock``) on the same prompts: the server's greedy tokens, under concurrent
load and streamed, must equal it. Only one server runs at a time: starting
one stops any other this module started.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ascend_kernel.cli.serving import REPORT_PATH, LocalServer
from tests.e2e.conftest import CLI, ENGINE_TIMEOUT_S, clean_env, generate, run_cli, zygote_server

pytestmark = pytest.mark.e2e

API_KEY = "sk-ascend-kernel-test"
MAX_TOKENS = 8
CONCURRENT = 64
WORDS = ("river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal", "harbor", "copper",
         "orbit", "violin", "desert", "ladder", "cloud")
#: 64 different prompts of 3 to 11 words
PROMPTS = [f"Request {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 9))
           for i in range(CONCURRENT)]
SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"]

_running: list[LocalServer] = []


def start_server(model: Path, log_path: Path, *extra: str, eager: bool = True, **env_extra: str) -> LocalServer:
    for server in _running:  # one engine at a time on this host
        server.stop()
    _running.clear()
    env = clean_env(VLLM_CPU_KVCACHE_SPACE="1", **env_extra)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's AsyncLLM always runs its engine core apart
    args = SERVE_ARGS if eager else [a for a in SERVE_ARGS if a != "--enforce-eager"]
    server = zygote_server([*CLI, "serve", str(model), *args, "--api-key", API_KEY, *extra], env, log_path,
                           api_key=API_KEY)
    _running.append(server)
    return server.start(timeout_s=ENGINE_TIMEOUT_S)


@pytest.fixture(scope="module")
def offline(tiny_llama) -> dict[str, list[int]]:
    """Stock vLLM's greedy tokens per prompt (one offline run, before any server starts)."""
    run = generate(tiny_llama, "--stock", max_tokens=MAX_TOKENS, prompts=PROMPTS)
    return {o["prompt"]: {"prompt": o["prompt_token_ids"], "tokens": o["token_ids"]} for o in run["outputs"]}


@pytest.fixture(scope="module")
def server(tiny_llama, offline, tmp_path_factory) -> Any:
    # sleep mode on, and vLLM's dev routes (/sleep, /wake_up, /is_sleeping, /collective_rpc) for its test
    server = start_server(tiny_llama, tmp_path_factory.mktemp("serve") / "server.log", "--enable-sleep-mode",
                          VLLM_SERVER_DEV_MODE="1")
    yield server
    server.stop()


def client(server: LocalServer) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


GREEDY = dict(max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


async def complete_all(server: LocalServer, model: str, prompts: list[str]) -> list[Any]:
    async with client(server) as api:
        return await asyncio.gather(*(api.completions.create(model=model, prompt=p, **GREEDY) for p in prompts))


async def stream_all(server: LocalServer, model: str, prompts: list[str]) -> list[tuple[list[int], list[int], str]]:
    async def one(api: Any, prompt: str) -> tuple[list[int], list[int], str]:
        prompt_ids: list[int] = []
        tokens: list[int] = []
        reason = ""
        async for chunk in await api.completions.create(model=model, prompt=prompt, stream=True, **GREEDY):
            choice = chunk.choices[0]
            prompt_ids += getattr(choice, "prompt_token_ids", None) or []
            tokens += getattr(choice, "token_ids", None) or []
            reason = choice.finish_reason or reason
        return prompt_ids, tokens, reason

    async with client(server) as api:
        return await asyncio.gather(*(one(api, p) for p in prompts))


def http(server: LocalServer, method: str, path: str, body: bytes | None = None,
         key: str | None = API_KEY) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{server.base_url}{path}", data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str) -> float:
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)]
    assert values, f"{name} not in /metrics"
    return sum(values)


# -- start-up errors (no server) ----------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "family", "known"), [
    ("ASCEND_KERNEL_SAMPLER", "sampler", "vllm-default"),
    # chosen per KV spec in the workers, but an unknown name is refused where the engine is configured
    ("ASCEND_KERNEL_KV_CACHE_LAYOUT", "kv_cache", "standard"),
])
def test_unknown_forced_name_stops_the_server_with_one_paragraph(tiny_llama, variable, family, known):
    # refused after vLLM is imported: the kernel's zygote runs it (no fresh interpreter)
    proc = run_cli(["serve", str(tiny_llama), *SERVE_ARGS], expect_rc=2, zygote="kernel",
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", **{variable: "bogus"}))
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ascend-kernel: error: Unknown {family} 'bogus' (forced by {variable})"), last
    assert known in last


def test_bad_setting_stops_serve_before_vllm(tiny_llama):
    proc = run_cli(["serve", str(tiny_llama)], expect_rc=2, env=clean_env(ASCEND_KERNEL_DEVICE="gpu"))
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "ASCEND_KERNEL_DEVICE='gpu'" in proc.stderr


# -- one server for the rest ------------------------------------------------------------------------------


def test_concurrent_completions_equal_offline_greedy(server, tiny_llama, offline):
    started = time.perf_counter()
    answers = asyncio.run(complete_all(server, str(tiny_llama), PROMPTS))
    took = time.perf_counter() - started
    wrong = []
    for prompt, answer in zip(PROMPTS, answers):
        choice = answer.choices[0]
        assert choice.finish_reason == "length"
        if (choice.prompt_token_ids, choice.token_ids) != (offline[prompt]["prompt"], offline[prompt]["tokens"]):
            wrong.append((prompt, choice.token_ids, offline[prompt]["tokens"]))
    assert not wrong, f"{len(wrong)} of {len(PROMPTS)} differ from offline stock vLLM, e.g. {wrong[:3]}"
    print(f"{CONCURRENT} concurrent completions in {took:.2f} s")


def test_streaming_returns_the_same_tokens(server, tiny_llama, offline):
    prompts = PROMPTS[:16]
    for prompt, (prompt_ids, tokens, reason) in zip(prompts, asyncio.run(stream_all(server, str(tiny_llama), prompts))):
        assert (prompt_ids, tokens) == (offline[prompt]["prompt"], offline[prompt]["tokens"]), prompt
        assert reason == "length"


def test_bad_requests_get_4xx_and_the_server_stays_healthy(server, tiny_llama, offline):
    model = str(tiny_llama)

    def body(**fields: Any) -> bytes:
        return json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, **fields}).encode()

    cases = {
        "negative max_tokens": (body(max_tokens=-3), 400),
        "unknown model": (body(model="no-such-model"), 404),
        "prompt longer than max_model_len": (body(prompt="hello " * 700), 400),
        "malformed JSON": (b'{"model": "x", "prompt": "hi"', 400),
    }
    for name, (payload, wanted) in cases.items():
        status, text = http(server, "POST", "/v1/completions", payload)
        assert status == wanted, (name, status, text[:300])
        assert "error" in json.loads(text), (name, text[:300])
    # an image for this text-only model (the vision-language cases: tests/e2e/test_vision_serving.py)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(_png()).decode()}}
    chat = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [image, {"type": "text",
                                                                                            "text": "hello"}]}]}
    status, text = http(server, "POST", "/v1/chat/completions", json.dumps(chat).encode())
    assert status == 400 and "is not a multimodal model" in json.loads(text)["error"]["message"], text[:500]
    assert http(server, "GET", "/health", key=None)[0] == 200
    (answer,) = asyncio.run(complete_all(server, model, PROMPTS[:1]))
    assert answer.choices[0].token_ids == offline[PROMPTS[0]]["tokens"]


def _png() -> bytes:
    import io

    from tests.vlm_inputs import make_image

    buffer = io.BytesIO()
    make_image(0, 56, 56).save(buffer, format="PNG")
    return buffer.getvalue()


def test_kv_cache_usage_is_zero_after_the_load(server, tiny_llama):
    asyncio.run(complete_all(server, str(tiny_llama), PROMPTS))
    deadline = time.monotonic() + 60
    while True:
        text = http(server, "GET", "/metrics", key=None)[1]
        usage, running = metric(text, "vllm:kv_cache_usage_perc"), metric(text, "vllm:num_requests_running")
        if (usage, running) == (0.0, 0.0) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (usage, running) == (0.0, 0.0)


def test_report_route_shows_the_engines_decisions_and_needs_the_key(server, tiny_llama):
    status, text = http(server, "GET", REPORT_PATH, key=None)
    assert (status, json.loads(text)) == (401, {"error": "Unauthorized"})
    assert http(server, "GET", REPORT_PATH, key="wrong")[0] == 401
    assert http(server, "GET", "/v1/models", key=None)[0] == 401  # the same rule as vLLM's own routes
    status, text = http(server, "GET", REPORT_PATH)
    assert status == 200, text[:500]
    report = json.loads(text)
    assert report["device"]["kind"] == "cpu"  # picked by `serve` (no ASCEND_KERNEL_DEVICE in its env)
    families = {d["family"]: d for d in report["decisions"]}
    for family in ("attention_backend", "attention_state", "sampler", "graph", "kv_cache"):
        assert families[family]["chosen"], family
    assert families["attention_state"]["chosen"] == "standard"
    assert report["kv_cache"]["layouts"][0]["layout"] == "standard"
    assert report["ops_provider"] == "reference"
    assert set(report["startup_ms"]) == {"discovery", "selection"}
    trace = report["trace"]
    assert trace["steps"] > 0 and sum(trace["attention_states"].values()) == trace["steps"]
    assert {"PrefillNoCache", "DecodeOnly"} <= set(trace["attention_states"])
    assert report["ranks"][0]["trace"] == trace
    assert http(server, "POST", REPORT_PATH, b"{}")[0] == 405


def test_startup_log_says_once_that_the_kernel_is_active_and_what_it_chose(server):
    log = server.log_text()
    assert log.count("ascend-kernel is active: device cpu") == 1, log[-3000:]
    for family in ("attention_backend", "attention_state", "sampler", "graph", "kv_cache[FullAttentionSpec]"):
        lines = [line for line in log.splitlines() if f"ascend-kernel decision {family} -> " in line]
        assert len(lines) == 1, (family, lines)
        assert "plugin " in lines[0]
    assert "ascend-kernel KV cache: FullAttentionSpec -> standard" in log
    assert f"the kernel's live report: GET {REPORT_PATH}" in log


def test_sleep_and_wake_up_routes_free_the_engines_memory_and_give_the_same_tokens(server, tiny_llama, offline):
    """Level 1, then level 2 with vLLM's ``reload_weights`` RPC, through the routes; the engine core's RSS falls
    by at least the KV cache while asleep (the core is the server's child process holding the most memory)."""
    import psutil

    def core_rss() -> int:
        return max(p.memory_info().rss for p in psutil.Process(server.process.pid).children(recursive=True))

    def post(path: str, body: bytes | None = None) -> dict[str, Any]:
        status, text = http(server, "POST", path, body)
        assert status == 200, (path, status, text[:500])
        return json.loads(text)

    def sleeping() -> bool:
        return json.loads(http(server, "GET", "/is_sleeping")[1])["is_sleeping"]

    def same_tokens() -> None:
        answers = asyncio.run(complete_all(server, str(tiny_llama), PROMPTS[:4]))
        assert [a.choices[0].token_ids for a in answers] == [offline[p]["tokens"] for p in PROMPTS[:4]]

    kv_bytes = json.loads(http(server, "GET", REPORT_PATH)[1])["kv_cache"]["allocated_bytes"]
    awake = core_rss()
    assert post("/sleep?level=1") == {"status": "sleeping", "level": 1} and sleeping()
    asleep = core_rss()
    assert awake - asleep >= kv_bytes, (awake, asleep, kv_bytes)
    assert post("/wake_up")["status"] == "awake" and not sleeping()
    same_tokens()
    awake = core_rss()
    assert post("/sleep?level=2") == {"status": "sleeping", "level": 2}
    assert awake - core_rss() >= kv_bytes
    assert post("/wake_up?tags=weights")["status"] == "sleeping"  # the KV cache is still away
    post("/collective_rpc", json.dumps({"method": "reload_weights"}).encode())
    assert post("/wake_up?tags=kv_cache")["status"] == "awake" and not sleeping()
    same_tokens()
    print(f"engine core RSS {awake / 2**20:.0f} MiB awake, {asleep / 2**20:.0f} MiB asleep (level 1); "
          f"KV cache {kv_bytes / 2**20:.0f} MiB")


# A chat completion on a real model (SmolLM2) through ``serve``: tests/e2e/test_pd_disaggregation.py's deployment
# (two ``ascend-kernel serve`` instances behind the PD proxy), where its tokens equal transformers', its prompt is
# the chat template as transformers applies it and its text transformers' detokenization.


def test_moe_model_served_under_vllms_default_compilation(tmp_path):
    """``serve`` without ``--enforce-eager`` on Qwen2-MoE: vLLM-CPU compiles the model (Dynamo + inductor) with
    the kernel's MoE layer inside (at TP=1 its routed experts traced, vLLM-CPU's fused kernel in the graph, as
    stock compiles it; the report says so); concurrent greedy answers equal transformers'."""
    from ascend_kernel.models import create_tiny_model

    from tests.e2e.conftest import hf_greedy

    model = create_tiny_model("qwen2_moe", tmp_path / "qwen2_moe")
    server = start_server(model, tmp_path / "server.log", eager=False)
    try:
        answers = asyncio.run(complete_all(server, str(model), PROMPTS[:6]))
        ours = [a.choices[0].token_ids for a in answers]
        assert ours == hf_greedy(model, [a.choices[0].prompt_token_ids for a in answers], MAX_TOKENS)
        log = server.log_text()
        assert "enforce_eager=False" in log and "DYNAMO_TRACE_ONCE" in log, log[-3000:]
        status, body = http(server, "GET", REPORT_PATH)
        assert status == 200 and json.loads(body)["trace"]["moe_methods"].get("allgather", 0) > 0
        assert json.loads(body)["moe_comm"]["experts_under_compile"]["traced"] is True, body
    finally:
        server.stop()
        _running.clear()

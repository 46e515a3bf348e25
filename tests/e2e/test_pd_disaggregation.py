"""Prefill/decode disaggregation over vLLM's MooncakeConnector (TCP on loopback), through ``ascend-kernel pd-proxy``.

One deployment for the module, started the way a user starts it:
``ascend-kernel serve-pd SMOLLM2 --prefill 1 --decode 1`` (a kv_producer and
a kv_consumer ``ascend-kernel serve``, float32, and the proxy in front) on
the real SmolLM2-135M-Instruct, with the kernel's Ascend attention backend
and layer ops on the reference provider (``ASCEND_KERNEL_ATTENTION_BACKEND``
and ``ASCEND_KERNEL_LAYER_OPS`` = ``ascend``): the backend's float pages (the
``standard`` layout) move whole. Requests go to the proxy with the official
``openai`` client; the oracle is transformers' greedy generation on the
prompt token ids the server reports. A chat goes through the proxy too (the
model's trained chat template as transformers applies it, its text
transformers' detokenization, and the capital of France is Paris): the
suite's chat completion on a real model through ``ascend-kernel serve``.
The instances' ``/metrics`` and ``/ascend-kernel/report`` show where the
prompt was computed and how many pages moved. The Ascend backend's int8 and
MLA pages, and a TP=2 producer, are ``tests/e2e/test_pd_backends.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ascend_kernel.cli.serving import REPORT_PATH, LocalServer
from tests.e2e.conftest import CLI, ENGINE_TIMEOUT_S, REPO, clean_env, hf_greedy, run_cli, zygote_server

pytestmark = pytest.mark.e2e

MAX_TOKENS = 6
#: 32-token blocks (vLLM-CPU's default is 128; its attention takes multiples of 32): the long prompt spans many,
#: the shared prefix two
BLOCK = 32
SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--block-size", str(BLOCK)]
PREFIX = ("In the old harbor town the river met the sea, and every morning the fishing boats went out past "
          "the stone lighthouse while the gulls circled over the nets and the market square slowly filled with "
          "traders, carts and the smell of fresh bread. By noon the sailors came back with their catch, the "
          "church bell rang twice, the school let the children out for lunch, and the old men on the bench by "
          "the fountain argued about the weather, the price of fish and the new road to the city, and")
#: short prompts, two sharing a long prefix, and one longer than several blocks
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    PREFIX + " the bakers opened their doors",
    PREFIX + " the children ran to school",
    " ".join(f"word{i} follows the previous word in this long line of text," for i in range(12)),
]
#: VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT of the deployment (vLLM's default: 480 s): a producer frees pages nobody
#: pulled, and answers a pull it cannot serve, after this long
ABORT_TIMEOUT_S = 8
#: ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S of the deployment: a consumer gives up on a silent producer after this
#: long (vLLM alone: ABORT_TIMEOUT_S + 60 s)
PULL_TIMEOUT_S = 12
#: concurrent requests through the proxy (short prompts, few tokens)
CONCURRENT = 16
CONCURRENT_TOKENS = 4
GREEDY = dict(max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


def mooncake_missing() -> str | None:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the Mooncake transfer engine does not load here ({exc}); see docs/setup.md"
    return None


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return json.loads(answer.read())


def prompt_tokens_by_source(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=60) as answer:
        text = answer.read().decode()
    found = re.findall(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="([a-z_]+)"[^}]*\} ([0-9.eE+-]+)$', text, re.M)
    return {source: float(value) for source, value in found}


@pytest.fixture(scope="module")
def model() -> Path:
    """The real SmolLM2-135M-Instruct (prepared once, shared with `make demo` and tests/e2e/test_real_model.py)."""
    from ascend_kernel.models.real import DEFAULT_DIR, prepare_real_model

    return prepare_real_model(REPO / DEFAULT_DIR)


@pytest.fixture(scope="module")
def deployment(model, tmp_path_factory) -> Any:
    reason = mooncake_missing()
    if reason is not None:
        pytest.skip(reason)
    logs = tmp_path_factory.mktemp("pd")
    # short transfer timeouts for the fault tests: the producer's abort timeout, the consumer's pull timeout
    env = clean_env(VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=str(ABORT_TIMEOUT_S),
                    ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S=str(PULL_TIMEOUT_S),
                    ASCEND_KERNEL_ATTENTION_BACKEND="ascend", ASCEND_KERNEL_LAYER_OPS="ascend")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    proxy = zygote_server([*CLI, "serve-pd", str(model), "--prefill", "1", "--decode", "1", "--log-dir", str(logs),
                           *SERVE_ARGS], env, logs / "serve-pd.log")
    proxy.start(timeout_s=ENGINE_TIMEOUT_S)
    status = get_json(f"{proxy.base_url}/pd-proxy/status")
    yield {"proxy": proxy, "prefill": status["prefill"][0]["url"], "decode": status["decode"][0]["url"], "logs": logs}
    proxy.stop()


def client(proxy: LocalServer) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{proxy.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


#: the chat through the proxy (the real model knows the answer)
CHAT = "What is the capital of France?"


@pytest.fixture(scope="module")
def answers(deployment, model) -> dict[str, Any]:
    """Every request of the module, sent once: completions (prefix-sharing pair one after the other), a chat, a stream."""
    model = str(model)

    async def run() -> dict[str, Any]:
        async with client(deployment["proxy"]) as api:
            # the first three at once, then the prompt that shares the third's prefix, then the long one
            first = await asyncio.gather(*(api.completions.create(model=model, prompt=p, **GREEDY)
                                           for p in PROMPTS[:3]))
            rest = [await api.completions.create(model=model, prompt=p, **GREEDY) for p in PROMPTS[3:]]
            chat = await api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": CHAT}], **GREEDY)
            streamed: list[int] = []
            async for chunk in await api.completions.create(model=model, prompt=PROMPTS[0], stream=True, **GREEDY):
                streamed += getattr(chunk.choices[0], "token_ids", None) or []
            return {"completions": [*first, *rest], "chat": chat, "streamed": streamed}

    return asyncio.run(run())


@pytest.fixture(scope="module")
def oracle(answers, model) -> list[list[int]]:
    """Transformers' greedy tokens for the completions and then the chat (one oracle run: loading it costs)."""
    prompt_ids = [c.choices[0].prompt_token_ids for c in answers["completions"]]
    assert answers["chat"].prompt_token_ids, "the chat answer carries no prompt token ids"
    return hf_greedy(model, [*prompt_ids, answers["chat"].prompt_token_ids], MAX_TOKENS)


def test_completions_through_the_proxy_equal_transformers(answers, oracle):
    ours = [c.choices[0].token_ids for c in answers["completions"]]
    assert all(len(t) == MAX_TOKENS for t in ours)
    assert ours == oracle[:-1]
    assert answers["streamed"] == ours[0], "the streamed answer differs from the same prompt's plain answer"
    assert answers["completions"][0].choices[0].text.startswith(" Paris")  # "The capital of France is"


def test_chat_through_the_proxy_equals_transformers(answers, oracle, model):
    from transformers import AutoTokenizer

    chat = answers["chat"]
    assert chat.choices[0].token_ids == oracle[-1]
    assert "Paris" in chat.choices[0].message.content
    # the server applied the model's chat template and detokenized the answer as transformers does
    tokenizer = AutoTokenizer.from_pretrained(model)
    template = tokenizer.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True)
    assert chat.prompt_token_ids == list(getattr(template, "input_ids", template))
    assert chat.choices[0].message.content == tokenizer.decode(chat.choices[0].token_ids, skip_special_tokens=True)
    assert chat.usage.completion_tokens == MAX_TOKENS


def test_decode_instance_computed_no_prompt_and_reports_count_the_pages(answers, deployment):
    prompt_lens = [len(c.choices[0].prompt_token_ids) for c in answers["completions"]]
    prompt_lens += [len(answers["chat"].prompt_token_ids), prompt_lens[0]]  # the chat, the streamed repeat
    assert max(prompt_lens) > 4 * BLOCK, "the long prompt must span several blocks"
    decode_tokens = prompt_tokens_by_source(deployment["decode"])
    prefill_tokens = prompt_tokens_by_source(deployment["prefill"])
    # vLLM counts a prompt token computed by the consumer as local_compute: none were
    assert decode_tokens["local_compute"] == 0, decode_tokens
    assert decode_tokens["external_kv_transfer"] + decode_tokens["local_cache_hit"] == sum(prompt_lens), decode_tokens
    assert prefill_tokens["local_compute"] + prefill_tokens["local_cache_hit"] == sum(prompt_lens), prefill_tokens
    assert prefill_tokens["local_cache_hit"] >= 2 * BLOCK, "the prompt sharing a prefix should hit the prefill's cache"

    decode_report = get_json(deployment["decode"] + REPORT_PATH)
    prefill_report = get_json(deployment["prefill"] + REPORT_PATH)
    # both instances ran the Ascend backend (forced by the setting) on its float pages, moved whole
    for report in (prefill_report, decode_report):
        backend = next(d for d in report["decisions"] if d["family"] == "attention_backend")
        assert backend["chosen"] == "ascend"
        assert [u["layout"] for u in report["kv_cache"]["layouts"]] == ["standard"]
    # the kernel's own step trace: every step of the decode instance ran one token per request
    assert set(decode_report["trace"]["attention_states"]) == {"DecodeOnly"}, decode_report["trace"]
    assert "PrefillNoCache" in prefill_report["trace"]["attention_states"]

    sent, received = prefill_report["kv_transfer"], decode_report["kv_transfer"]
    assert (sent["kv_role"], received["kv_role"]) == ("kv_producer", "kv_consumer")
    block = decode_report["kv_cache"]["layouts"][0]["block_size"]
    assert block == BLOCK
    external_blocks = decode_tokens["external_kv_transfer"] / block
    assert received["kv_requests_received"] == len(prompt_lens)
    assert received["kv_blocks_received"] == sent["kv_blocks_sent"] > 0
    assert math.floor(external_blocks) <= received["kv_blocks_received"] <= sum(math.ceil(n / block)
                                                                               for n in prompt_lens)
    assert received["kv_bytes_received"] == sent["kv_bytes_sent"] == received["kv_blocks_received"] * \
        received["kv_bytes_per_block"]
    # one page per layer and block
    assert received["kv_bytes_per_block"] == sum(u["page_bytes"] * u["layers"]
                                                 for u in decode_report["kv_cache"]["layouts"])
    assert sent["kv_bytes_transferred"] == received["kv_bytes_transferred"] > 0
    assert sent["kv_failed_transfers"] == received["kv_failed_transfers"] == 0


def test_proxy_balances_and_counts(answers, deployment):
    status = get_json(f"{deployment['proxy'].base_url}/pd-proxy/status")
    requests = len(answers["completions"]) + 2
    assert [(i["requests"], i["errors"]) for i in status["prefill"] + status["decode"]] == [(requests, 0)] * 2


def kv_cache_usage(base_url: str) -> float:
    """vLLM's ``kv_cache_usage_perc`` of one instance (0: no block held by any request)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=60) as answer:
        metrics = answer.read().decode()
    usage = re.search(r"^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.eE+-]+)$", metrics, re.M)
    assert usage is not None, "no vllm:kv_cache_usage_perc in /metrics"
    return float(usage.group(1))


def wait_for_no_blocks(base_url: str, within_s: float) -> float:
    """Seconds until the instance holds no KV block (a producer frees a request's pages a step after they moved)."""
    import time

    started = time.monotonic()
    while kv_cache_usage(base_url) != 0.0:
        assert time.monotonic() - started < within_s, f"{base_url} still holds KV blocks after {within_s} s"
        time.sleep(0.2)
    return time.monotonic() - started


# -- after the counting tests: they count every request sent so far -----------------------------------------


def test_concurrent_requests_through_the_proxy_equal_transformers_and_free_every_block(answers, deployment,
                                                                                        model):
    goods = ["pears", "nails", "tea", "rope"]
    prompts = [f"Order {i}: {i % 7 + 2} boxes of {goods[i % 4]} for" for i in range(CONCURRENT)]
    before = get_json(f"{deployment['proxy'].base_url}/pd-proxy/status")

    async def run() -> list[Any]:
        async with client(deployment["proxy"]) as api:
            return list(await asyncio.gather(*(api.completions.create(
                model=str(model), prompt=p, **{**GREEDY, "max_tokens": CONCURRENT_TOKENS}) for p in prompts)))

    completions = asyncio.run(run())
    prompt_ids = [c.choices[0].prompt_token_ids for c in completions]
    ours = [c.choices[0].token_ids for c in completions]
    assert len(set(map(tuple, prompt_ids))) == CONCURRENT
    assert ours == hf_greedy(model, prompt_ids, CONCURRENT_TOKENS)

    after = get_json(f"{deployment['proxy'].base_url}/pd-proxy/status")
    for role in ("prefill", "decode"):
        assert after[role][0]["requests"] - before[role][0]["requests"] == CONCURRENT
        assert after[role][0]["errors"] == before[role][0]["errors"] == 0
    assert prompt_tokens_by_source(deployment["decode"])["local_compute"] == 0
    # every request's blocks are freed on both sides: the consumer's when it finished, the producer's once pulled
    wait_for_no_blocks(deployment["decode"], within_s=30)
    wait_for_no_blocks(deployment["prefill"], within_s=30)


def test_a_decode_whose_pages_never_come_fails_within_the_abort_timeout_frees_blocks_and_serves_on(
        answers, deployment, model):
    """The producer is alive but was never asked for ``transfer_id`` (or holds it for another request).

    vLLM's producer waits ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` for pages under
    that id, then answers the pull with an error; the consumer fails the
    request. A bootstrap address nobody listens on fails at once. Meanwhile the
    prefill that nobody pulls is freed on the producer after the same timeout.
    """
    import time

    from ascend_kernel.cli.serving import free_port

    prompt = {"model": str(model), "prompt": PROMPTS[1], "temperature": 0, "max_tokens": MAX_TOKENS}
    failed_before = get_json(deployment["decode"] + REPORT_PATH)["kv_transfer"]["kv_failed_transfers"]
    status, held = post(deployment["prefill"] + "/v1/completions", {
        **prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "never-pulled"}})
    assert status == 200 and kv_cache_usage(deployment["prefill"]) > 0  # its pages wait for a consumer
    producer = held["kv_transfer_params"]

    started = time.monotonic()
    status, failed = post(deployment["decode"] + "/v1/completions",
                          {**prompt, "kv_transfer_params": {**producer, "transfer_id": "never-sent"}},
                          timeout=ABORT_TIMEOUT_S + 120)
    waited = time.monotonic() - started
    assert status == 500 and failed["error"]["type"] == "InternalServerError", (status, failed)
    assert ABORT_TIMEOUT_S - 1 < waited < ABORT_TIMEOUT_S + 30, waited
    decode_log = (deployment["logs"] / "decode0.log").read_text(errors="replace")
    assert "Timeout waiting for P side ready" in decode_log  # the producer's answer, in the consumer's log

    started = time.monotonic()
    nowhere = {**producer, "remote_engine_id": "no-such-engine", "transfer_id": "nowhere",
               "remote_bootstrap_addr": f"http://127.0.0.1:{free_port()}"}
    status, failed = post(deployment["decode"] + "/v1/completions", {**prompt, "kv_transfer_params": nowhere})
    assert status == 500 and time.monotonic() - started < 10
    assert "Failed to connect to bootstrap server" in (deployment["logs"] / "decode0.log").read_text(errors="replace")

    assert get_json(deployment["decode"] + REPORT_PATH)["kv_transfer"]["kv_failed_transfers"] == failed_before + 2
    assert kv_cache_usage(deployment["decode"]) == 0.0, "the decode instance kept a failed request's blocks"
    wait_for_no_blocks(deployment["prefill"], within_s=ABORT_TIMEOUT_S + 10)  # the unpulled prefill's pages
    # both instances still serve, disaggregated: the same prompt through the proxy equals its earlier answer
    status, again = post(f"{deployment['proxy'].base_url}/v1/completions",
                         {**prompt, "ignore_eos": True, "return_token_ids": True})
    assert status == 200 and again["choices"][0]["token_ids"] == answers["completions"][1].choices[0].token_ids


def test_mooncake_on_a_model_with_recurrent_state_is_one_clear_error(tmp_path):
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("mamba2", tmp_path / "mamba2")
    config = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"})
    proc = run_cli(["generate", "--model", str(model), "--max-tokens", "2", "--engine-arg",
                    f"kv_transfer_config={config}"], env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), expect_rc=2)
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("ascend-kernel: error:"), proc.stderr[-2000:]
    assert "MooncakeConnector" in error and "recurrent" in error and "Mamba2ForCausalLM" in error


# -- faults: the last tests of the module (they kill the prefill instance) ---------------------------------


def kill_instance(serve_pd: LocalServer, url: str) -> None:
    """SIGKILL the instance ``serve_pd`` started at ``url`` and every process under it (engine core, worker)."""
    import signal
    from urllib.parse import urlsplit

    import psutil

    port = str(urlsplit(url).port)
    server = next(child for child in psutil.Process(serve_pd.process.pid).children()
                  if "serve" in child.cmdline() and port in child.cmdline())  # its own "--port PORT"
    processes = [server, *server.children(recursive=True)]
    for process in processes:
        process.send_signal(signal.SIGKILL)  # zombies until serve-pd reaps them: wait for the port, not the pids
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=10)


def get_status_and_json(url: str) -> tuple[int, Any]:
    import urllib.error

    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def post(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    import urllib.error

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_prefill_dies_after_prefill_decode_fails_within_the_pull_timeout_frees_blocks_and_proxy_names_it(
        answers, deployment, model):
    import time

    prompt = {"model": str(model), "prompt": PROMPTS[4], "temperature": 0}
    failed_before = get_json(deployment["decode"] + REPORT_PATH)["kv_transfer"]["kv_failed_transfers"]
    status, prefilled = post(deployment["prefill"] + "/v1/completions", {
        **prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "dies"}})
    assert status == 200 and prefilled["kv_transfer_params"]["transfer_id"] == "dies"
    kill_instance(deployment["proxy"], deployment["prefill"])  # the producer host is gone, its pages with it

    # the consumer already knows this producer's workers, so it asks the dead one directly; nothing answers, and
    # the kernel's pull timeout ends the wait (vLLM alone: its socket timeout, the abort timeout + 60 s)
    started = time.monotonic()
    status, failed = post(deployment["decode"] + "/v1/completions",
                          {**prompt, "max_tokens": MAX_TOKENS, "kv_transfer_params": prefilled["kv_transfer_params"]},
                          timeout=ABORT_TIMEOUT_S + 120)
    waited = time.monotonic() - started
    assert status == 500 and "error" in failed
    assert PULL_TIMEOUT_S - 1 < waited < PULL_TIMEOUT_S + 30, waited
    decode_log = (deployment["logs"] / "decode0.log").read_text(errors="replace")
    assert f"sent no answer within {PULL_TIMEOUT_S} s (ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S)" in decode_log
    status, through_proxy = post(f"{deployment['proxy'].base_url}/v1/completions", {**prompt, "max_tokens": 2})
    # the proxy's health checks took the dead producer out of the rotation: it says so, naming it
    assert status == 503, through_proxy
    assert through_proxy["error"]["message"].startswith(f"no healthy prefill instance: {deployment['prefill']} (")
    status, health = get_status_and_json(f"{deployment['proxy'].base_url}/health")
    assert status == 503 and health["prefill"][0]["healthy"] is False

    assert kv_cache_usage(deployment["decode"]) == 0.0, "the decode instance kept the failed request's blocks"
    assert get_json(deployment["decode"] + REPORT_PATH)["kv_transfer"]["kv_failed_transfers"] == failed_before + 1
    # and it still serves: the same prompt computed locally equals the disaggregated answer of before
    status, local = post(deployment["decode"] + "/v1/completions",
                         {**prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "return_token_ids": True})
    assert status == 200 and local["choices"][0]["token_ids"] == answers["completions"][4].choices[0].token_ids



# Producer and consumer at different TP sizes (``serve-pd --prefill-tp 2``): tests/e2e/test_pd_backends.py's int8
# deployment, where a TP=2 producer hands its pages to a TP=1 consumer. Not this module's deployment: under the
# 64-request load below, with the fault tests' 8 s abort timeout, a TP=2 producer on this 2-core host answers
# some pulls "Timeout waiting for P side ready".

"""Prefill/decode disaggregation on the kernel's Ascend attention backend: int8 KV pages and MLA pages.

One ``ascend-kernel serve-pd`` deployment per scenario (reference ops on this
CPU host, ``ASCEND_KERNEL_ATTENTION_BACKEND=ascend``), two prompts (a short
one and one over several blocks) through the proxy:

* ``int8``: tiny Llama with ``kv_cache_dtype=int8_per_token_head`` (the
  ``int8-bsh`` layout: int8 K/V and their scales in one page, all moved),
  the producer at TP=2 (``--prefill-tp 2``, two ranks on a core each) and the
  consumer at TP=1: the connector maps the KV heads between the two layouts
  (the tiny Llama's one KV head is replicated on both producer ranks, and one
  rank sends it).
  The decode instance reads the prompt's first tokens back from int8 pages
  and computes the last prompt token itself, so the oracle is transformers
  with the prompt fed as its first ``n - 1`` tokens, then the last, every
  cached key and value rounded to int8 (tests/e2e/test_kv_int8.py);
* ``mla``: tiny DeepSeek-V2 (the ``mla`` layout: latent + rope pages),
  oracle transformers' plain greedy tokens.

The backend's float pages (the ``standard`` layout) move in
``tests/e2e/test_pd_disaggregation.py``'s deployment (the real SmolLM2).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import pytest

from ascend_kernel.cli.serving import REPORT_PATH
from tests.e2e.conftest import CLI, ENGINE_TIMEOUT_S, clean_env, hf_greedy, zygote_server
from tests.e2e.test_pd_disaggregation import GREEDY, MAX_TOKENS, get_json, mooncake_missing, prompt_tokens_by_source

pytestmark = pytest.mark.e2e

PROMPTS = ["The capital of France is", " ".join(f"w{i} and" for i in range(40))]


class Scenario(NamedTuple):
    model: str  # a tiny model's architecture
    args: tuple[str, ...]
    layout: str  # the KV-cache layout both instances must report
    prefill_tp: int = 1  # the producer's TP size (the consumer's is 1)


SCENARIOS = {
    "int8": Scenario("llama", ("--kv-cache-dtype", "int8_per_token_head", "--prefill-tp", "2"), "int8-bsh",
                     prefill_tp=2),
    "mla": Scenario("deepseek_v2", (), "mla"),
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request, tmp_path_factory) -> Any:
    reason = mooncake_missing()
    if reason is not None:
        pytest.skip(reason)
    from ascend_kernel.models import create_tiny_model

    spec = SCENARIOS[request.param]
    logs = tmp_path_factory.mktemp(f"pd-{request.param}")
    model = create_tiny_model(spec.model, logs / spec.model, seed=0)
    env = clean_env(ASCEND_KERNEL_ATTENTION_BACKEND="ascend")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    proxy = zygote_server([*CLI, "serve-pd", str(model), "--log-dir", str(logs), "--dtype", "float32",
                           "--max-model-len", "512", "--enforce-eager", "--seed", "0", *spec.args], env,
                          logs / "serve-pd.log")
    proxy.start(timeout_s=ENGINE_TIMEOUT_S)
    try:
        status = get_json(f"{proxy.base_url}/pd-proxy/status")

        async def run() -> list[Any]:
            from openai import AsyncOpenAI

            async with AsyncOpenAI(base_url=f"{proxy.base_url}/v1", api_key="unused", max_retries=0,
                                   timeout=300) as api:
                return list(await asyncio.gather(*(api.completions.create(model=str(model), prompt=p, **GREEDY)
                                                   for p in PROMPTS)))

        answers = asyncio.run(run())
        reports = {role: get_json(status[role][0]["url"] + REPORT_PATH) for role in ("prefill", "decode")}
        metrics = prompt_tokens_by_source(status["decode"][0]["url"])
    finally:
        proxy.stop()
    return {"name": request.param, "model": model, "layout": spec.layout, "answers": answers,
            "reports": reports, "decode_tokens": metrics, "prefill_tp": spec.prefill_tp}


def test_pd_on_the_ascend_backend_equals_transformers(scenario):
    answers = scenario["answers"]
    prompt_ids = [a.choices[0].prompt_token_ids for a in answers]
    ours = [a.choices[0].token_ids for a in answers]
    if scenario["name"] == "int8":
        from tests.e2e.test_kv_int8 import hf_greedy_int8_kv

        oracle = hf_greedy_int8_kv(scenario["model"], prompt_ids, MAX_TOKENS, cached=[len(p) - 1 for p in prompt_ids])
    else:
        oracle = hf_greedy(scenario["model"], prompt_ids, MAX_TOKENS)
    assert ours == oracle


def test_pd_on_the_ascend_backend_moves_whole_pages(scenario):
    prefill, decode = scenario["reports"]["prefill"], scenario["reports"]["decode"]
    for report in (prefill, decode):
        backend = next(d for d in report["decisions"] if d["family"] == "attention_backend")
        assert backend["chosen"] == "ascend"
        assert [u["layout"] for u in report["kv_cache"]["layouts"]] == [scenario["layout"]]
    assert scenario["decode_tokens"]["local_compute"] == 0, scenario["decode_tokens"]
    assert set(decode["trace"]["attention_states"]) == {"DecodeOnly"}
    assert [r["rank"] for r in prefill["ranks"]] == list(range(scenario["prefill_tp"]))
    assert [r["rank"] for r in decode["ranks"]] == [0]
    # every producer rank counts what it sent itself (the top level is rank 0's)
    sent, received = [r["kv_transfer"] for r in prefill["ranks"]], decode["kv_transfer"]
    assert sent[0] == prefill["kv_transfer"]
    assert received["kv_requests_received"] == len(scenario["answers"])
    # one page per layer and block, whatever it holds (int8 K/V + scales, or MLA latent + rope)
    assert received["kv_bytes_per_block"] == sum(u["page_bytes"] * u["layers"] for u in decode["kv_cache"]["layouts"])
    assert received["kv_blocks_received"] >= 2
    # a rank that sent, sent every block pulled (its heads' share of each); together, every byte received
    assert {s["kv_blocks_sent"] for s in sent if s["kv_bytes_sent"]} == {received["kv_blocks_received"]}
    assert received["kv_bytes_received"] == sum(s["kv_bytes_sent"] for s in sent) > 0
    assert received["kv_failed_transfers"] == 0 and all(s["kv_failed_transfers"] == 0 for s in sent)

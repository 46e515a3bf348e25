"""PD disaggregation path: with a KV connector configured, caches are 2 MiB-aligned and handed to it."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import clean_env, generate, hf_greedy, tokens

pytestmark = pytest.mark.e2e
MIB2 = 2 * 1024 * 1024


def test_kv_connector_gets_aligned_caches_and_tokens_stay_exact(tiny_llama, tmp_path):
    store = tmp_path / "kv_store"
    kvt = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"shared_storage_path": str(store)}})
    run = generate(tiny_llama, "--engine-arg", f"kv_transfer_config={kvt}", env=clean_env(ASCEND_KERNEL_DEVICE="cpu"),
                   max_tokens=8)
    assert tokens(run) == hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in run["outputs"]], 8)
    kv = run["report"]["kv_cache"]
    assert kv["alignment"] == MIB2
    layers = kv["layouts"][0]["layers"]
    assert 0 < kv["slack_bytes"] <= MIB2 * (2 + layers)  # start + per-layer rounding, nothing more
    assert any(p.is_file() for p in store.rglob("*")), "the connector saved nothing from the caches"

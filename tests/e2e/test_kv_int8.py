"""int8 per-token-head KV caches (the int8 BSH layout) end to end, against transformers.

``kv_cache_dtype=int8_per_token_head`` with the Ascend backend on the
reference ops: the backend publishes the BSH page spec, the ``int8-bsh``
layout makes the caches, K/V are quantised on write and read back
dequantised. The oracle is transformers' own greedy generation with an
attention function that rounds every *cached* key and value to int8 per
token and head (vLLM's convention) before SDPA, and leaves the prompt's
self-attention in full precision, as the backend's PrefillNoCache does.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import clean_env, generate, tokens

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8
ASCEND = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend")


def fake_int8(x):
    """Quantise-dequantise each row of the last dim: scale = max|x| / 127, round half away from zero."""
    import torch

    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-6)
    y = x * (1.0 / scale)
    return (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-128, 127) * scale


def hf_greedy_int8_kv(model, prompt_token_ids, max_tokens):
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM, GenerationConfig
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        if key.shape[-2] > query.shape[-2]:  # decoding: keys/values come from the (int8) cache
            key, value = fake_int8(key), fake_int8(value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("int8_kv_sdpa", attention)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="int8_kv_sdpa").eval()
    out = []
    with torch.no_grad():
        for ids in prompt_token_ids:
            x = torch.tensor([ids])
            config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0,
                                      bos_token_id=None)
            out.append(hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="module")
def int8_run(tiny_llama):
    return generate(tiny_llama, "--engine-arg", "kv_cache_dtype=int8_per_token_head", env=ASCEND,
                    max_tokens=MAX_TOKENS)


def test_int8_bsh_tokens_equal_transformers_with_int8_cache(int8_run, tiny_llama):
    prompt_ids = [o["prompt_token_ids"] for o in int8_run["outputs"]]
    assert tokens(int8_run) == hf_greedy_int8_kv(tiny_llama, prompt_ids, MAX_TOKENS)
    states = int8_run["report"]["trace"]["attention_states"]
    assert states == {"PrefillNoCache": 1, "DecodeOnly": MAX_TOKENS - 1}


def test_int8_bsh_layout_made_the_caches_at_int8_size(int8_run, tiny_llama):
    import json

    report = int8_run["report"]
    chosen = {d["subject"]: d for d in report["decisions"] if d["family"] == "kv_cache"}
    assert chosen["FullAttentionSpec"]["chosen"] == "int8-bsh"
    rejected = {c["name"]: c["reason"] for c in chosen["FullAttentionSpec"]["candidates"] if c["name"] != "int8-bsh"}
    assert "int8" in rejected["standard"]
    (usage,) = report["kv_cache"]["layouts"]
    assert usage["layout"] == "int8-bsh" and usage["layers"] == 2
    config = json.loads((tiny_llama / "config.json").read_text())
    heads, dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    per_token = heads * 2 * dim + 2 * 4 * heads  # int8 K and V, float32 scales
    assert usage["page_bytes"] == per_token * usage["block_size"]  # a quarter of float32's 2 * 4 * dim per head
    assert usage["bytes"] % (usage["page_bytes"] * 2) == 0  # whole pages for both layers
    assert report["kv_cache"]["requested_bytes"] == usage["bytes"]

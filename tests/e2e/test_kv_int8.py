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

import json

import pytest

from tests.e2e.conftest import clean_env, generate, tokens

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8
CHUNK = 16
LONG = "the quick brown fox jumps over the lazy dog " * 3
ASCEND = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend")


def fake_int8(x):
    """Quantise-dequantise each row of the last dim: scale = max|x| / 127, round half away from zero."""
    import torch

    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-6)
    y = x * (1.0 / scale)
    return (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-128, 127) * scale


def hf_greedy_int8_kv(model, prompt_token_ids, max_tokens, chunk: int | None = None,
                      cached: list[int] | None = None):
    """Greedy decoding in transformers, each prompt fed in pieces, every cache read rounded to int8.

    Pieces: chunks of ``chunk`` tokens (whole prompt when None), or, with
    ``cached``, the prompt's first ``cached[i]`` tokens (what vLLM served from
    its prefix cache) and then the rest. Keys and values read from the cache
    (every attention whose keys outnumber its queries) are rounded to int8
    first, as the backend's cache reads are.
    """
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, **kwargs):
        if key.shape[-2] > query.shape[-2]:
            key, value = fake_int8(key), fake_int8(value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("int8_kv_sdpa", attention)
    AttentionMaskInterface.register("int8_kv_sdpa", sdpa_mask)  # causal masks aligned to the cache end
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="int8_kv_sdpa").eval()
    out = []
    with torch.no_grad():
        for i, ids in enumerate(prompt_token_ids):
            if cached is not None:
                bounds = sorted({0, cached[i], len(ids)})
            else:
                bounds = [*range(0, len(ids), chunk or len(ids)), len(ids)]
            cache = DynamicCache(config=hf.config)
            for start, end in zip(bounds, bounds[1:]):
                logits = hf(torch.tensor([ids[start:end]]), past_key_values=cache, use_cache=True).logits
            generated = [int(logits[0, -1].argmax())]
            while len(generated) < max_tokens:
                logits = hf(torch.tensor([[generated[-1]]]), past_key_values=cache, use_cache=True).logits
                generated.append(int(logits[0, -1].argmax()))
            out.append(generated)
    return out


def int8_graph_run(tiny_llama, capture_mode: str) -> dict:
    return generate(tiny_llama, "--engine-arg", "kv_cache_dtype=int8_per_token_head", "--graph-mode", "cpu-graph",
                    "--graph-capture-mode", capture_mode, "--capture-sizes", "4", env=ASCEND, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def int8_run(tiny_llama):
    """The plain prefill-then-decode scenario, under cpu-graph ``piecewise`` (one engine for this and the
    piecewise graph test, suite time: the attention op runs between the captured pieces, as in eager; eager int8
    prefill and decode run in the chunked, prefix-cache and n-gram scenarios below)."""
    return int8_graph_run(tiny_llama, "piecewise")


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


def test_int8_chunked_prefill_equals_transformers_fed_the_same_chunks(tiny_llama):
    """Later chunks read the whole prefix, their own chunk included, back from the int8 cache."""
    prompts = [LONG + "and then", "Once upon a time, there was a little cat who lived in a big old house by the sea"]
    run = generate(tiny_llama, "--engine-arg", "kv_cache_dtype=int8_per_token_head", "--engine-arg", "max_num_seqs=1",
                   "--engine-arg", f"max_num_batched_tokens={CHUNK}", env=ASCEND, max_tokens=MAX_TOKENS,
                   prompts=prompts)
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert max(len(ids) for ids in prompt_ids) > CHUNK
    assert tokens(run) == hf_greedy_int8_kv(tiny_llama, prompt_ids, MAX_TOKENS, chunk=CHUNK)
    assert run["report"]["trace"]["attention_states"].get("ChunkedPrefill", 0) > 0


def test_int8_prefix_cache_hit_reads_the_cached_prefix_back_from_int8(tiny_llama):
    """PrefillCacheHit: the new tokens attend over the int8 prefix another request left in the cache."""
    prompts = [LONG + "and then", LONG + "while the cat"]
    run = generate(tiny_llama, "--engine-arg", "kv_cache_dtype=int8_per_token_head", "--engine-arg", "max_num_seqs=1",
                   "--engine-arg", "enable_chunked_prefill=false", "--engine-arg", "enable_prefix_caching=true",
                   "--engine-arg", "block_size=16", env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    assert run["report"]["trace"]["attention_states"].get("PrefillCacheHit", 0) > 0
    cached = [o["num_cached_tokens"] for o in run["outputs"]]
    assert cached[0] == 0 and cached[1] >= 16
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert tokens(run) == hf_greedy_int8_kv(tiny_llama, prompt_ids, MAX_TOKENS, cached=cached)


def test_int8_ngram_spec_decode_reads_drafts_back_from_int8(tiny_llama):
    """SpecDecoding verifies several tokens at once; each reads every K/V, its own included, from the int8 cache."""
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1})
    prompts = [LONG + "the quick", "the quick brown fox jumps over the lazy dog and the quick brown fox"]
    run = generate(tiny_llama, "--engine-arg", "kv_cache_dtype=int8_per_token_head", "--speculative-config", spec,
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    assert run["report"]["trace"]["attention_states"].get("SpecDecoding", 0) > 0
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert tokens(run) == hf_greedy_int8_kv(tiny_llama, prompt_ids, MAX_TOKENS)


@pytest.mark.parametrize("capture_mode", ["piecewise", "full_decode_only"])
def test_int8_pages_under_graph_capture_equal_transformers(int8_run, tiny_llama, capture_mode):
    """int8 pages and their scales are written and read by the attention op that runs between (piecewise) or
    inside (full_decode_only) the captured artifacts: the tokens equal transformers' with an int8 cache (the
    piecewise run is the module's ``int8_run``)."""
    run = int8_run if capture_mode == "piecewise" else int8_graph_run(tiny_llama, capture_mode)
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert tokens(run) == hf_greedy_int8_kv(tiny_llama, prompt_ids, MAX_TOKENS)
    graph = run["report"]["graph"]
    assert graph["capture_mode"] == capture_mode and graph["replays"] == {"4": MAX_TOKENS - 1}, graph

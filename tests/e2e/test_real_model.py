"""A real model (SmolLM2-135M-Instruct, 134.5 M parameters) through the kernel == transformers, token for token.

The tiny random models prove every code path for a given architecture; this
module proves the kernel gives a trained model's answers: greedy tokens equal
transformers' (float32) on vLLM's CPU attention and on the Ascend backend with
the Ascend layer ops (RMSNorm, rotary) on the reference ops, in every
attention state, and the capital of France comes out as Paris.

Two engines per backend, several states each (engine start-up dominates):

* ``sequential``: chunked prefill off, prefix caching on, one sequence at a
  time: a plain prompt and a chat message (PrefillNoCache, DecodeOnly), then
  the same long prefix twice (the second prompt is a PrefillCacheHit); on
  vLLM's CPU attention under cpu-graph ``full_decode_only``, so every decode
  step replays one whole-model artifact (the prefills run eagerly);
* ``chunked_ngram``: a 16-token step budget, two sequences, ngram drafts: long
  prompts are cut into chunks beside running decodes (ChunkedPrefill) and
  drafts are verified (SpecDecoding).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, assert_same_tokens, clean_env, generate, hf_greedy, run_cli

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8
CAPITAL = "The capital of France is"
CAPITAL_CHAT = "What is the capital of France?"
LONG = "the quick brown fox jumps over the lazy dog " * 4
BACKENDS = {
    "vllm-native": clean_env(ASCEND_KERNEL_DEVICE="cpu"),
    "ascend": clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend",
                        ASCEND_KERNEL_LAYER_OPS="ascend"),
}
SEQUENTIAL = ("--engine-arg", "max_num_seqs=1", "--engine-arg", "enable_chunked_prefill=false",
              "--engine-arg", "enable_prefix_caching=true", "--engine-arg", "block_size=32",
              "--chat", CAPITAL_CHAT)
SEQUENTIAL_PROMPTS = [CAPITAL, LONG + "and then", LONG + "while the cat"]
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
CHUNKED_NGRAM = ("--engine-arg", "max_num_seqs=2", "--engine-arg", "max_num_batched_tokens=16",
                 "--speculative-config", NGRAM)
CHUNKED_NGRAM_PROMPTS = [LONG + "the quick", CAPITAL, LONG + "and the quick brown"]


@pytest.fixture(scope="module")
def real_model() -> Path:
    from ascend_kernel.models.real import DEFAULT_DIR, prepare_real_model

    return prepare_real_model(REPO / DEFAULT_DIR)  # shared with `make demo`: prepared once


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request) -> str:
    return request.param


#: the sequential scenario's decode steps (batches of 1) replay whole-model artifacts on vLLM's CPU attention
FULL_DECODE_GRAPHS = ("--graph-mode", "cpu-graph", "--graph-capture-mode", "full_decode_only", "--capture-sizes", "1")


@pytest.fixture(scope="module")
def sequential(real_model, backend) -> dict[str, Any]:
    graphs = FULL_DECODE_GRAPHS if backend == "vllm-native" else ()
    return generate(real_model, *SEQUENTIAL, *graphs, env=BACKENDS[backend], max_tokens=MAX_TOKENS,
                    prompts=SEQUENTIAL_PROMPTS)


@pytest.fixture(scope="module")
def chunked_ngram(real_model, backend) -> dict[str, Any]:
    return generate(real_model, *CHUNKED_NGRAM, env=BACKENDS[backend], max_tokens=MAX_TOKENS,
                    prompts=CHUNKED_NGRAM_PROMPTS)


#: transformers' greedy tokens by prompt token ids: both backends (and both scenarios) share prompts
_HF_TOKENS: dict[tuple[int, ...], list[int]] = {}


def _equals_hf(model: Path, run: dict[str, Any]) -> None:
    prompt_ids = [tuple(o["prompt_token_ids"]) for o in run["outputs"]]
    missing = list(dict.fromkeys(ids for ids in prompt_ids if ids not in _HF_TOKENS))
    if missing:
        _HF_TOKENS.update(zip(missing, hf_greedy(model, [list(ids) for ids in missing], MAX_TOKENS)))
    assert_same_tokens(model, run, [_HF_TOKENS[ids] for ids in prompt_ids])


def _backend_did_the_work(run: dict[str, Any], backend: str) -> dict[str, int]:
    report = run["report"]
    decisions = {d["family"]: d for d in report["decisions"]}
    assert decisions["attention_backend"]["chosen"] == backend
    if backend == "ascend":
        assert decisions["layer_ops"]["chosen"] == "ascend"
        assert report["ops_provider"] == "reference"
        assert report["layer_ops"]["replaced"] == ["MMEncoderAttention", "MRotaryEmbedding", "RMSNorm",
                                                   "RotaryEmbedding"]  # what the ascend layer ops register
        # 30 decoder layers x 2 norms + the final norm; one rotary embedding shared by the layers
        assert report["layer_ops"]["layers_built"] == {"RMSNorm": 61, "RotaryEmbedding": 1}
    else:
        assert decisions["layer_ops"]["chosen"] == "vllm-native"
    return report["trace"]["attention_states"]


def _answer(run: dict[str, Any], prompt: str, chat: bool) -> str:
    return next(o["text"] for o in run["outputs"] if o["prompt"] == prompt and o["chat"] == chat)


def test_sequential_prefill_decode_and_prefix_cache_hit(real_model, backend, sequential):
    _equals_hf(real_model, sequential)
    assert "Paris" in _answer(sequential, CAPITAL, chat=False)
    assert "Paris" in _answer(sequential, CAPITAL_CHAT, chat=True)
    states = _backend_did_the_work(sequential, backend)
    # four sequences one after another: three fresh prefills, one over the cached long prefix
    assert states == {"PrefillNoCache": 3, "PrefillCacheHit": 1, "DecodeOnly": 4 * (MAX_TOKENS - 1)}
    cached = {o["prompt"]: o["num_cached_tokens"] for o in sequential["outputs"]}
    assert cached[LONG + "while the cat"] == 32  # one whole 32-token block of the shared prefix (vLLM-CPU needs multiples of 32)
    assert cached[CAPITAL] == cached[LONG + "and then"] == 0
    if backend == "vllm-native":  # under full decode graphs: every decode step replayed the size-1 artifact
        graph = sequential["report"]["graph"]
        assert graph["capture_mode"] == "full_decode_only" and graph["captured_sizes"] == [1], graph
        assert graph["replays"] == {"1": 4 * (MAX_TOKENS - 1)}, graph


def test_chunked_prefill_and_ngram_spec_decoding(real_model, backend, chunked_ngram):
    _equals_hf(real_model, chunked_ngram)
    assert "Paris" in _answer(chunked_ngram, CAPITAL, chat=False)
    states = _backend_did_the_work(chunked_ngram, backend)
    for state in ("PrefillNoCache", "ChunkedPrefill", "SpecDecoding"):
        assert states.get(state, 0) > 0, f"never reached {state}: {states}"
    trace = chunked_ngram["report"]["trace"]
    assert trace["drafter_calls"] > 0 and trace["rejection_sampler_calls"] > 0


def test_real_model_command_is_instant_once_prepared(real_model):
    import time

    start = time.monotonic()
    proc = run_cli(["real-model", "--json", "--out", str(real_model)])
    assert json.loads(proc.stdout)["path"] == str(real_model)
    assert time.monotonic() - start < 30  # a Python start-up and a marker read, no conversion
    assert "Converting" not in proc.stderr


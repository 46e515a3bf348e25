"""Dynamic EPLB end to end on two CPU ranks (TP=2 + EP), through the CLI, against transformers.

Two tiny MoE models, the two routing paths of the kernel's MoE layer: the
DeepSeek-V2 routes in vLLM (its grouped top-k router), the Qwen3-MoE in the
kernel (plain softmax top-k: the seam's gating op); in both the kernel's MoE
layer maps logical ids to physical ones and records the load. Traffic is
skewed: each prompt is one token id repeated, without BOS
(``--prompt-ids``), so its prompt tokens all pick the same experts.
``window_size=2, step_interval=3`` puts the first rearrangement after the
first step and one every three steps after it, so a run of a few tokens
crosses several; the greedy tokens must still equal transformers' token for
token. One engine per scenario:

* ``deepseek-default-redundant``: vLLM's default policy with 2 redundant
  experts (6 physical experts for 4 logical ones: replicas served), the map
  recorded, under the MoE comm policy of an A3 (all-to-all prefill, MC2 decode);
  then a second engine replays the recorded map at ``step_interval=1``: the
  same tokens, no rearrangement, the map kept (issue 41, bug 6);
* ``qwen3-swap-limited``: the swap-limited policy (1 swap per layer), no
  replicas, under an A2's (naive multicast prefill, MC2 decode).

These two are also ``test_moe_expert_parallel.py``'s A3 and A2 scenarios: each
rank's trace must show exactly those methods serving batches.

Each rank's trace carries the ``eplb`` object; the recorded map must be the
map the last rearrangement installed, and the config changes must name what
the plugin set on vLLM's config.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import assert_same_tokens, clean_env, generate, hf_greedy
from tests.e2e.test_moe_expert_parallel import check_expert_parallel_run

pytestmark = pytest.mark.e2e
MAX_TOKENS = 6
PROMPT_IDS = [[263] * 8, [300] * 8]
EXPERT_PARALLEL = ("--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   "--engine-arg", "max_num_seqs=4", "--engine-arg", "enable_eplb=True")
#: the MoE comm policy each scenario runs under: the SoC's, so the methods carry replicas' physical slots too
A3 = {"ASCEND_KERNEL_SOC": "A3"}
A2 = {"ASCEND_KERNEL_SOC": "A2", "ASCEND_KERNEL_MC2_MIN_WORLD_SIZE": "2"}
SCENARIOS = {
    # id -> (tiny model, eplb_config, kernel settings, comm methods that must run on every rank)
    "deepseek-default-redundant": ("deepseek_v2", {"window_size": 2, "step_interval": 3,
                                                   "num_redundant_experts": 2}, A3, {"alltoall", "mc2"}),
    "qwen3-swap-limited": ("qwen3_moe", {"window_size": 2, "step_interval": 3, "policy": "swap-limited"},
                           {"ASCEND_KERNEL_EPLB_MAX_SWAPS": "1", **A2}, {"naive_multicast", "mc2"}),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_eplb_rearranges_and_tokens_equal_transformers(scenario, tmp_path_factory, tmp_path):
    from ascend_kernel.models import create_tiny_model

    arch, eplb_config, settings, methods = SCENARIOS[scenario]
    model = create_tiny_model(arch, tmp_path_factory.mktemp("eplb") / arch)
    oracle = hf_greedy(model, PROMPT_IDS, MAX_TOKENS)
    record = tmp_path / "expert_map.json"
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ENABLE_V1_MULTIPROCESSING="1",
                    ASCEND_KERNEL_EPLB_RECORD_PATH=str(record), **settings)
    args = [*EXPERT_PARALLEL, "--engine-arg", f"eplb_config={json.dumps(eplb_config)}"]
    for ids in PROMPT_IDS:
        args += ["--prompt-ids", ",".join(map(str, ids))]
    run = generate(model, *args, env=env, max_tokens=MAX_TOKENS, prompts=[])
    assert [o["prompt_token_ids"] for o in run["outputs"]] == PROMPT_IDS  # no BOS was added
    assert_same_tokens(model, run, oracle)
    # test_moe_expert_parallel's checks of the SoC policies' methods: these runs are its A3 and A2 scenarios
    check_expert_parallel_run(run, methods, set())

    report = run["report"]
    changed = {c["path"]: c for c in report["config_changes"]}
    assert changed["parallel_config.enable_eplb"]["new"] == "True"
    assert changed["parallel_config.eplb_config.use_async"]["new"] == "False"
    assert changed["parallel_config.eplb_config.communicator"]["new"] == "torch_gloo"
    policy = eplb_config.get("policy", "default")
    decision = next(d for d in report["decisions"] if d["family"] == "eplb_policy")
    assert decision["chosen"] == policy

    redundant = eplb_config.get("num_redundant_experts", 0)
    objects = [rank["trace"]["eplb"] for rank in report["ranks"]]
    assert len(objects) == 2
    for eplb in objects:
        assert eplb["policy"] == policy
        assert eplb["physical_experts"] == 4 + redundant and eplb["logical_experts"] == 4
        assert eplb["rebalances"] >= 2, eplb  # at least one window recorded under a rearranged map
        assert eplb["imbalance_before"] is not None and eplb["imbalance_before"] >= 1.0
        assert eplb["imbalance_after"] is not None and eplb["imbalance_after"] >= 1.0
        assert eplb["rebalance_ms"] > 0
        assert eplb["globals_left_swapped"] == [], "torch.Event / current_stream are torch's own after the moves"
        for entry in eplb["history"]:
            for row in entry["map"]:
                assert sorted(set(row)) == [0, 1, 2, 3] and len(row) == 4 + redundant  # every expert placed
        if policy == "swap-limited":
            assert all(entry["moved"] <= 2 * eplb["num_moe_layers"] for entry in eplb["history"])  # 1 swap a layer
    # the ranks agree on every placement (vLLM's EplbState runs the policy on the all-reduced load)
    assert [e["map"] for e in objects[0]["history"]] == [e["map"] for e in objects[1]["history"]]
    first = objects[0]
    if policy == "default":  # vLLM's policy replicates the hot experts: weights really moved mid-run
        assert first["moved_experts"] > 0, first
    if policy == "swap-limited":  # it only takes swaps that lower the hottest rank's load (no replicas to split)
        assert first["imbalance_after_projected"] <= first["imbalance_before"] + 1e-9, first
    recorded = json.loads(record.read_text())
    assert recorded["physical_to_logical"] == objects[0]["history"][-1]["map"]
    assert recorded["ep_size"] == 2
    if redundant:  # replay on another engine, at step_interval=1 (a rearrangement due every step if not kept)
        replay_map = tmp_path / "replayed_map.json"
        eplb_config = {**eplb_config, "step_interval": 1}
        env.update(ASCEND_KERNEL_EPLB_REPLAY_PATH=str(record), ASCEND_KERNEL_EPLB_RECORD_PATH=str(replay_map))
        args = [a if not a.startswith("eplb_config=") else f"eplb_config={json.dumps(eplb_config)}" for a in args]
        replayed = generate(model, *args, env=env, max_tokens=MAX_TOKENS, prompts=[])
        assert_same_tokens(model, replayed, oracle)
        for rank in replayed["report"]["ranks"]:
            eplb = rank["trace"]["eplb"]
            assert eplb["replayed"] and eplb["rebalances"] == 0 and eplb["moved_experts"] > 0, eplb
        # written after the replayed map was installed, and never again: the recorded map, kept
        assert json.loads(replay_map.read_text())["physical_to_logical"] == recorded["physical_to_logical"]

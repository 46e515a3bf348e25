"""Other model families through the kernel: MLA + MoE, MoE, Mamba.

Each is checked token for token against transformers' greedy generation, with
the kernel's report showing which KV layout made the caches and which MoE
method each forward pass got. DeepSeek-V2 also shows why the kernel's MLA
fix-ups exist: stock vLLM-CPU in float32 is wrong (rotary op) unless told.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, clean_env, generate, hf_greedy, run_cli, tokens

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8
KERNEL = clean_env(ASCEND_KERNEL_DEVICE="cpu")
#: vLLM scales the routed experts' sum, transformers the routing weights: by a power of two both are exact
ROUTED_SCALE = {"routed_scaling_factor": 2.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    base = tmp_path_factory.mktemp("families")
    made = {arch: create_tiny_model(arch, base / arch) for arch in ("deepseek_v2", "qwen2_moe", "mamba2", "falcon_h1")}
    # routed experts scaled (a power of two, exact on both sides), so its compiled graph holds the muls + add
    made["deepseek_mtp"] = create_tiny_model("deepseek_mtp", base / "deepseek_mtp", overrides=ROUTED_SCALE)
    return made


def oracle_for(model, run):
    return hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)


def decision(run, family):
    return next(d for d in run["report"]["decisions"] if d["family"] == family)


@pytest.fixture(scope="module")
def deepseek(models):
    run = generate(models["deepseek_v2"], env=KERNEL, max_tokens=MAX_TOKENS)
    return run, oracle_for(models["deepseek_v2"], run)


def test_deepseek_mla_matches_hf_by_default(deepseek):
    run, oracle = deepseek
    assert tokens(run) == oracle
    kv = decision(run, "kv_cache")
    assert (kv["subject"], kv["chosen"], kv["plugin"]) == ("MLAAttentionSpec", "mla", "kv-cache-mla")
    layouts = run["report"]["kv_cache"]["layouts"]
    assert [(u["layout"], u["layers"]) for u in layouts] == [("mla", 2)]
    changes = {c["path"]: c for c in run["report"]["config_changes"]}
    assert "-rotary_embedding" in changes["compilation_config.custom_ops"]["new"]
    assert changes["compilation_config.custom_ops"]["plugin"] == "attention"
    assert "CPU_MLA" in changes["attention_config.backend"]["new"]


def test_deepseek_moe_method_per_step(deepseek):
    run, _ = deepseek
    trace = run["report"]["trace"]
    # no expert parallelism: prefill -> naive multicast, decode -> all-gather (one forward per step)
    assert trace["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}


def test_stock_vllm_cpu_needs_the_fixups_the_kernel_applies(models, deepseek):
    _, oracle = deepseek
    backend = json.dumps({"backend": "CPU_MLA"})
    wrong = generate(models["deepseek_v2"], "--stock", "--engine-arg", f"attention_config={backend}",
                     max_tokens=MAX_TOKENS)
    assert tokens(wrong) != oracle, "stock vLLM-CPU's rotary op was expected to mis-handle MLA in float32"
    fixed = generate(models["deepseek_v2"], "--stock", "--engine-arg", f"attention_config={backend}",
                     "--engine-arg", 'compilation_config={"custom_ops": ["all", "-rotary_embedding"]}',
                     max_tokens=MAX_TOKENS)
    assert tokens(fixed) == oracle


#: a vllm-ascend launch command's keys the kernel honors (docs/vllm-ascend-config.md), given to the MLA explain
VLLM_ASCEND_KEYS = {"enable_kv_nz": False, "refresh": True, "torchair_graph_config": {"enabled": False},
                    "eplb_config": {"eplb_heat_collection_stage": "all"}}


def test_explain_json_on_mla_model(models):
    proc = run_cli(["explain", "--json", "--model", str(models["deepseek_v2"]),
                    "--additional-config", json.dumps(VLLM_ASCEND_KEYS)], env={**KERNEL, "VLLM_ASCEND_ENABLE_MLAPO": "0"})
    report = json.loads(proc.stdout)
    honored = {c["path"]: c for c in report["config_changes"] if c["plugin"] == "vllm-ascend-keys"}
    assert set(honored) == {"additional_config.enable_kv_nz", "additional_config.refresh",
                            "additional_config.torchair_graph_config.enabled",
                            "additional_config.eplb_config.eplb_heat_collection_stage", "VLLM_ASCEND_ENABLE_MLAPO"}
    assert "NZ-format KV cache" in honored["additional_config.enable_kv_nz"]["new"]
    families = [d["family"] for d in report["decisions"]]
    assert sorted(families) == sorted(["attention_backend", "attention_state", "attention_mask", "moe_comm", "moe_comm_method",
                                       "drafter", "sampler", "rejection_sampler", "graph", "layer_ops", "kv_cache",
                                       "quantization", "fusion_pass", "tp_comm"])
    kv = next(d for d in report["decisions"] if d["family"] == "kv_cache")
    assert kv["chosen"] == "mla"
    reasons = {c["name"]: c["reason"] for c in kv["candidates"]}
    assert reasons["standard"].startswith("unsupported") and reasons["sfa"].startswith("unsupported")
    assert report["kv_cache"]["layouts"][0]["bytes"] == report["kv_cache"]["requested_bytes"] > 0


def test_qwen2_moe_matches_hf_and_publishes_moe_methods(models):
    run = generate(models["qwen2_moe"], env=KERNEL, max_tokens=MAX_TOKENS)
    assert tokens(run) == oracle_for(models["qwen2_moe"], run)
    assert decision(run, "kv_cache")["chosen"] == "standard"
    assert run["report"]["trace"]["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}


def test_mamba2_state_layout_matches_hf_and_stock(models):
    run = generate(models["mamba2"], env=KERNEL, max_tokens=MAX_TOKENS)
    oracle = oracle_for(models["mamba2"], run)
    assert tokens(run) == oracle
    stock = generate(models["mamba2"], "--stock", max_tokens=MAX_TOKENS)
    assert tokens(stock) == oracle
    kv = decision(run, "kv_cache")
    assert (kv["subject"], kv["chosen"]) == ("MambaSpec", "mamba")
    assert run["report"]["trace"]["moe_methods"] == {}


def test_falcon_h1_hybrid_attention_and_mamba_in_one_allocation(models):
    run = generate(models["falcon_h1"], env=KERNEL, max_tokens=MAX_TOKENS)
    assert tokens(run) == oracle_for(models["falcon_h1"], run)
    chosen = {d["subject"]: d["chosen"] for d in run["report"]["decisions"] if d["family"] == "kv_cache"}
    assert chosen == {"FullAttentionSpec": "standard", "MambaSpec": "mamba"}
    kv = run["report"]["kv_cache"]
    # vLLM overlays the attention and Mamba groups on one backing buffer: both address all of it
    assert {u["layout"]: u["layers"] for u in kv["layouts"]} == {"standard": 2, "mamba": 2}
    assert kv["allocated_bytes"] == kv["requested_bytes"]


def test_qwen3_next_gated_delta_net_hybrid_in_bfloat16(tmp_path_factory):
    """Full attention + gated delta-net states (vLLM-CPU's GDN kernel needs bfloat16)."""
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("qwen3_next", tmp_path_factory.mktemp("q3n") / "qwen3_next", dtype="bfloat16")
    run = generate(model, "--dtype", "bfloat16", env=KERNEL, max_tokens=MAX_TOKENS)
    stock = generate(model, "--dtype", "bfloat16", "--stock", max_tokens=MAX_TOKENS)
    assert tokens(run) == tokens(stock)
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS, dtype="bfloat16")
    assert tokens(run) == oracle
    chosen = {d["subject"]: d["chosen"] for d in run["report"]["decisions"] if d["family"] == "kv_cache"}
    assert chosen == {"FullAttentionSpec": "standard", "MambaSpec": "mamba"}
    assert run["report"]["trace"]["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}


def test_qwen3_moe_qk_norms_fuse_with_rope_under_vllms_default_compilation(tmp_path_factory):
    """The qknorm-rope pass in vLLM-CPU's own compile path (Dynamo traces once, inductor compiles with the
    platform's pass manager), as cpu-graph's per-size compiles run it in tests/e2e/test_graph_capture.py.

    Qwen3-MoE normalises each q and k head before the rotary: with the seam's layers (``layer_ops=ascend``) the
    traced graph holds per-head ``rms_norm`` -> ``rope`` in every layer, and the pass turns each pair into one
    ``qk_norm_rope`` (vllm-ascend's ``fuse_qknorm_rope``). One match per layer, the greedy tokens equal
    transformers' (float32).

    The same engine carries a third party's pass (tests/thirdparty/fusion/ak_fusion_plugin, found by its entry
    point; nothing in the kernel names it): it swaps the seam's token-row ``rms_norm`` for its own registered op,
    after the built-in passes. The one such norm in this model is the first layer's input norm (every other
    norm adds a residual: ``add_rms_norm``); the per-head norms were fused before it ran, so it skips none."""
    from ascend_kernel.models import create_tiny_model
    from tests.e2e.conftest import compiles_every_graph

    model = create_tiny_model("qwen3_moe", tmp_path_factory.mktemp("families") / "qwen3_moe")
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    run = generate(model, "--engine-arg", "enforce_eager=false", max_tokens=MAX_TOKENS,
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend",
                                 PYTHONPATH=str(REPO / "tests" / "thirdparty" / "fusion"),
                                 **compiles_every_graph(tmp_path_factory)))
    assert tokens(run) == oracle_for(model, run)
    fusion = {p["name"]: p for p in run["report"]["fusion"]}
    assert fusion["qknorm-rope"]["enabled"] and fusion["qknorm-rope"]["graphs"] >= 1, fusion
    assert fusion["qknorm-rope"]["matches"] == layers and not fusion["qknorm-rope"]["skipped"], fusion
    assert fusion["norm-quant"]["matches"] == 0, fusion  # nothing quantized in this model
    assert fusion["rows-rms-norm"] == {"name": "rows-rms-norm", "enabled": True, "matches": 1, "skipped": {}}, fusion
    assert list(fusion).index("rows-rms-norm") > list(fusion).index("qknorm-rope")  # the table's order: priority
    [record] = [d for d in run["report"]["decisions"] if d["family"] == "fusion_pass"]
    assert "ak_fusion_plugin" in json.dumps(record)  # the decision names the third party's entry point


@pytest.mark.parametrize("arch", ["deepseek_mtp"])
def test_moe_models_under_vllms_default_compilation(models, arch, tmp_path_factory):
    """Without enforce_eager vLLM-CPU traces the model once with Dynamo and compiles it with inductor.
    (Qwen2-MoE under the same compilation: tests/e2e/test_serving.py, through ``serve``. DeepSeek-V2's parts are
    all compiled elsewhere, so it is not run here again (suite time): its dense MLA on vLLM's CPU MLA backend is
    DeepSeek-V3's here, and its MoE layer with softmax greedy routing is the sparse model's in
    tests/e2e/test_sfa.py::test_sparse_attention_under_vllms_default_compilation, a DeepSeek-V2 plus an indexer.)

    The MoE layer's routed experts and the seam's ops are opaque custom ops
    with fake implementations, so the trace never reads a device value on the
    host; the method is still chosen per forward pass at run time.

    DeepSeek-V3 (sigmoid grouped top-k routing, ``deepseek_mtp`` here) is the
    model that tripped inductor's peak-memory reorder: its router read the gate's
    output before the gate's matmul wrote it, so the graph plugin turns that pass
    off and says so in the config changes.

    The model scales its routed experts by 2.0; on this CPU host the muls-add
    pass stands down by default (inductor fuses the plain ``routed * 2.0 +
    shared`` itself, bench/fusion.py) and says so; the TP=2 cpu-graph DeepSeek
    run in test_graph_capture.py sets it on and counts its matches.
    """
    from tests.e2e.conftest import compiles_every_graph

    run = generate(models[arch], "--engine-arg", "enforce_eager=false", max_tokens=MAX_TOKENS,
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", **compiles_every_graph(tmp_path_factory)))
    assert tokens(run) == oracle_for(models[arch], run)
    fusion = {p["name"]: p for p in run["report"]["fusion"]}
    assert not fusion["muls-add"]["enabled"] and "stands down on a CPU host" in fusion["muls-add"]["why"], fusion
    assert run["report"]["trace"]["moe_methods"] == {"naive_multicast": 1, "allgather": MAX_TOKENS - 1}
    # TP=1, no EP: Dynamo traced the routed experts (vLLM-CPU's fused kernel in the graph, as stock compiles it)
    assert run["report"]["moe_comm"]["experts_under_compile"]["traced"] is True, run["report"]["moe_comm"]
    changes = {c["path"]: c for c in run["report"]["config_changes"]}
    inductor = changes["compilation_config.inductor_compile_config"]
    assert "'reorder_for_peak_memory': False" in inductor["new"] and inductor["plugin"] == "graph", inductor

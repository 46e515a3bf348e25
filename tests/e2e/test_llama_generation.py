"""Greedy generation on the tiny Llama: kernel == stock vLLM == Hugging Face, token for token.

One module-scoped run per configuration (engine start-up dominates), many
assertions per run. The kernel's report proves its plugins did the work.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, clean_env, generate, hf_greedy, run_cli, tokens

pytestmark = pytest.mark.e2e
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def kernel_run(tiny_llama):
    return generate(tiny_llama, env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def stock_run(tiny_llama):
    return generate(tiny_llama, "--stock", max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def oracle(tiny_llama, kernel_run):
    return hf_greedy(tiny_llama, [o["prompt_token_ids"] for o in kernel_run["outputs"]], MAX_TOKENS)


def test_kernel_matches_hf_and_stock(kernel_run, stock_run, oracle):
    assert stock_run["report"] is None, "the stock run must not have the kernel active"
    assert [o["prompt_token_ids"] for o in kernel_run["outputs"]] == [o["prompt_token_ids"] for o in stock_run["outputs"]]
    assert tokens(kernel_run) == oracle
    assert tokens(stock_run) == oracle
    assert all(len(t) == MAX_TOKENS for t in oracle)
    assert len({tuple(t) for t in oracle}) == len(oracle), "prompts should give different continuations"


def test_kernel_plugins_did_the_work(kernel_run, tiny_llama):
    report = kernel_run["report"]
    families = [d["family"] for d in report["decisions"]]
    assert families.count("kv_cache") == 1
    assert set(families) == {"attention_backend", "attention_state", "attention_mask", "moe_comm", "moe_comm_method", "drafter",
                             "sampler", "rejection_sampler", "graph", "layer_ops", "kv_cache", "quantization",
                             "fusion_pass", "tp_comm"}
    # the CPU default runs vLLM's own norm layers: no seam norm in the graph, and each pass says so
    assert {f["name"]: f["enabled"] for f in report["fusion"]} == {"norm-quant": False, "qknorm-rope": False,
                                                                   "muls-add": False}
    assert all("unsupported" in f["why"] for f in report["fusion"])
    assert next(d for d in report["decisions"] if d["family"] == "quantization")["chosen"] is None  # not quantized
    kv = report["kv_cache"]
    (usage,) = kv["layouts"]
    config = json.loads((tiny_llama / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    page = usage["block_size"] * config["num_key_value_heads"] * 2 * head_dim * 4  # float32 K and V
    assert usage == {"layout": "standard", "spec": "FullAttentionSpec", "layers": config["num_hidden_layers"],
                     "placements": usage["placements"], "bytes": kv["requested_bytes"],
                     "block_size": usage["block_size"], "page_bytes": page}
    assert kv["allocated_bytes"] == kv["requested_bytes"] and kv["slack_bytes"] == 0
    trace = report["trace"]
    # one prefill step, then one decode step per remaining token
    assert trace["attention_states"] == {"PrefillNoCache": 1, "DecodeOnly": MAX_TOKENS - 1}
    assert trace["sampler_calls"] == trace["steps"] == MAX_TOKENS
    assert report["sampler_class"] == "vllm.v1.sample.sampler.Sampler"
    assert trace["moe_methods"] == {}  # a dense model gets no MoE method


def test_ngram_speculative_decoding_through_kernel(tiny_llama, oracle, kernel_run):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1})
    run = generate(tiny_llama, "--speculative-config", spec, env=clean_env(ASCEND_KERNEL_DEVICE="cpu"),
                   max_tokens=MAX_TOKENS)
    assert tokens(run) == oracle  # greedy speculative decoding must not change a token
    records = {d["family"]: d for d in run["report"]["decisions"]}
    assert records["drafter"]["chosen"] == "ngram"
    assert records["drafter"]["plugin"] == "spec-decode-ngram"
    assert records["rejection_sampler"]["chosen"] == "ascend-rejection"
    trace = run["report"]["trace"]
    assert run["report"]["drafter_class"] == "vllm.v1.spec_decode.ngram_proposer.NgramProposer"
    assert trace["drafter_calls"] > 0
    assert trace["rejection_sampler_calls"] > 0
    assert trace["attention_states"].get("SpecDecoding", 0) + trace["attention_states"].get("ChunkedPrefill", 0) > 0


def test_third_party_plugin_through_real_entry_point(tiny_llama, oracle):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", PYTHONPATH=f"{REPO / 'tests' / 'thirdparty'}:{REPO}")
    run = generate(tiny_llama, env=env, max_tokens=MAX_TOKENS)
    assert tokens(run) == oracle
    sampler = next(d for d in run["report"]["decisions"] if d["family"] == "sampler")
    assert sampler["chosen"] == "demo-greedy"
    assert sampler["plugin"] == "demo"
    assert "ak_demo_plugin" in sampler["entry_point"]
    passed = {c["name"]: c["reason"] for c in sampler["candidates"] if not c["chosen"]}
    assert passed["vllm-default"].startswith("lower priority")
    assert run["report"]["sampler_class"].endswith("DemoSampler")


def test_forced_unknown_name_is_a_clear_error(tiny_llama):
    proc = run_cli(["generate", "--model", str(tiny_llama), "--max-tokens", "2"],
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_SAMPLER="nope"), expect_rc=2)
    assert "Unknown sampler 'nope'" in proc.stderr
    assert "vllm-default" in proc.stderr and "ASCEND_KERNEL_SAMPLER" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_setting_is_one_paragraph(tiny_llama):
    proc = run_cli(["generate", "--model", str(tiny_llama)], env=clean_env(ASCEND_KERNEL_DEVICE="gpu"), expect_rc=2)
    assert proc.stderr.strip().count("\n") == 0
    assert "ASCEND_KERNEL_DEVICE='gpu'" in proc.stderr and "'npu' or 'cpu'" in proc.stderr


def test_topk_topp_toggle_selects_the_seam_sampler(tiny_llama, oracle):
    run = generate(tiny_llama, env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ENABLE_TOPK_TOPP_OPTIMIZATION="1"),
                   max_tokens=MAX_TOKENS)
    assert tokens(run) == oracle
    sampler = next(d for d in run["report"]["decisions"] if d["family"] == "sampler")
    assert (sampler["chosen"], sampler["forced_by"]) == ("ascend-topk-topp", "highest priority (10)")

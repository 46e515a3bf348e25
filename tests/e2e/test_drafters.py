"""The drafter family end to end: each drafter's proposals verified by the target, lossless, with vLLM's counts.

``draft-model`` with the target as its own draft must accept (almost) every
draft, on vLLM's CPU attention and on the Ascend backend, whose draft passes
build their own attention metadata (``build_for_drafting``: the draft batch
is not the step's). A third party's drafters under method names vLLM does not
know (tests/thirdparty/ak_drafter_plugin, through vLLM's ``custom_class``
method) propose the known continuation (all accepted) or a wrong token at
every position (none accepted). Greedy tokens equal transformers' in every
case: speculation never changes the output. Counts are vLLM's own metrics
(``spec_decode`` in ``generate --json``).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, assert_same_tokens, clean_env, generate, hf_greedy

pytestmark = pytest.mark.e2e
MAX_TOKENS = 10
PROMPTS = ["The capital of France is", "Once upon a time, there was a little"]
ASCEND = {"ASCEND_KERNEL_ATTENTION_BACKEND": "ascend"}


def spec(method: str, model: str, k: int = 3) -> tuple[str, str]:
    return "--speculative-config", json.dumps({"method": method, "model": model, "num_speculative_tokens": k})


@pytest.fixture(scope="module")
def oracle(tiny_llama, tmp_path_factory):
    """Transformers' greedy continuations of the prompts, and a file the oracle drafter reads them from."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    continuations = hf_greedy(tiny_llama, prompt_ids, MAX_TOKENS)
    path = tmp_path_factory.mktemp("drafter") / "oracle.json"
    path.write_text(json.dumps([{"prompt_token_ids": p, "token_ids": c} for p, c in zip(prompt_ids, continuations)]))
    return continuations, path


def check(model, run, oracle, drafter, plugin):
    continuations, _ = oracle
    assert_same_tokens(model, run, continuations)
    decision = next(d for d in run["report"]["decisions"] if d["family"] == "drafter")
    assert (decision["chosen"], decision["plugin"]) == (drafter, plugin)
    trace = run["report"]["trace"]
    assert trace["drafter_calls"] > 0 and trace["rejection_sampler_calls"] > 0
    counts = run["spec_decode"]
    assert counts["num_drafts"] > 0 and counts["num_draft_tokens"] > 0
    return counts


@pytest.mark.parametrize("backend", ["vllm-native", "ascend"])
def test_draft_model_as_its_own_draft_accepts_nearly_everything(tiny_llama, oracle, backend):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", **(ASCEND if backend == "ascend" else {}))
    run = generate(tiny_llama, *spec("draft_model", str(tiny_llama)), env=env, max_tokens=MAX_TOKENS, prompts=PROMPTS)
    counts = check(tiny_llama, run, oracle, "draft-model", "spec-decode-draft-model")
    assert set(run["report"]["trace"]["attention_states"]) == {"PrefillNoCache", "SpecDecoding"}
    assert counts["num_accepted_tokens"] >= 0.99 * counts["num_draft_tokens"]
    assert run["report"]["drafter"]["kv_cache"].startswith("the draft model's own attention layers")
    chosen = next(d for d in run["report"]["decisions"] if d["family"] == "attention_backend")["chosen"]
    assert chosen == backend


@pytest.mark.parametrize(("drafter", "backend"), [("oracle", "ascend"), ("contrarian", "vllm-native")])
def test_third_party_drafter_under_a_new_method_name(tiny_llama, oracle, drafter, backend):
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", PYTHONPATH=str(REPO / "tests" / "thirdparty"),
                    AK_DRAFTER_ORACLE=str(oracle[1]), **(ASCEND if backend == "ascend" else {}))
    proposer = {"oracle": "OracleProposer", "contrarian": "ContrarianProposer"}[drafter]
    run = generate(tiny_llama, *spec("custom_class", f"ak_drafter_plugin.{proposer}"), env=env,
                   max_tokens=MAX_TOKENS, prompts=PROMPTS)
    counts = check(tiny_llama, run, oracle, drafter, "drafter-demo")
    expected = counts["num_draft_tokens"] if drafter == "oracle" else 0
    assert counts["num_accepted_tokens"] == expected


@pytest.fixture(scope="module")
def draft_models(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    base = tmp_path_factory.mktemp("draft_models")
    return {arch: create_tiny_model(arch, base / arch) for arch in ("deepseek_mtp", "llama_eagle", "llama_eagle3")}


@pytest.mark.parametrize("backend", ["vllm-native", "ascend"])
def test_mtp_layer_drafts_on_mla(draft_models, backend):
    """DeepSeek's MTP layer drafts (random: nothing accepted); MTP verifies with SpecDecoding, one-token steps too."""
    model = draft_models["deepseek_mtp"]
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", **(ASCEND if backend == "ascend" else {}))
    run = generate(model, "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 1}),
                   env=env, max_tokens=MAX_TOKENS, prompts=PROMPTS)
    oracle = hf_greedy(model, [o["prompt_token_ids"] for o in run["outputs"]], MAX_TOKENS)
    check(model, run, (oracle, None), "mtp", "spec-decode-mtp")
    assert set(run["report"]["trace"]["attention_states"]) == {"PrefillNoCache", "SpecDecoding"}
    kv = {d["subject"]: d["chosen"] for d in run["report"]["decisions"] if d["family"] == "kv_cache"}
    assert kv == {"MLAAttentionSpec": "mla"}


#: EAGLE-3 on vLLM's CPU attention runs under cpu-graph ``piecewise`` below, the same checks (suite time)
EAGLE_SCENARIOS = [("vllm-native", "eagle"), ("ascend", "eagle"), ("ascend", "eagle3")]


@pytest.mark.parametrize(("backend", "method"), EAGLE_SCENARIOS)
def test_eagle_head_drafts_and_verifies_as_chunked_prefill(tiny_llama, oracle, draft_models, backend, method):
    """EAGLE-1 (embedding + last hidden state) and EAGLE-3 (hidden states of several target layers) heads."""
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", **(ASCEND if backend == "ascend" else {}))
    head = draft_models["llama_eagle" if method == "eagle" else "llama_eagle3"]
    run = generate(tiny_llama, *spec(method, str(head), k=2), env=env, max_tokens=MAX_TOKENS, prompts=PROMPTS)
    check(tiny_llama, run, oracle, "eagle", "spec-decode-eagle")
    # EAGLE's verification batches run the split-fuse kernel (the drafter's rule, not attention's)
    assert set(run["report"]["trace"]["attention_states"]) == {"PrefillNoCache", "ChunkedPrefill"}


@pytest.mark.parametrize("capture_mode", ["piecewise", "full_decode_only"])
def test_eagle3_head_under_graph_capture(tiny_llama, oracle, draft_models, capture_mode):
    """EAGLE-3 under cpu-graph: the target model's captured artifacts still hand the drafter the hidden states of
    the layers it reads (auxiliary outputs), and the head's own forward runs between steps. On vLLM's CPU
    attention: the piecewise run is also EAGLE-3's scenario of the test above on that backend (attention runs
    between the captured pieces)."""
    run = generate(tiny_llama, *spec("eagle3", str(draft_models["llama_eagle3"]), k=2), "--graph-mode", "cpu-graph",
                   "--graph-capture-mode", capture_mode, "--capture-sizes", "1,2,4,8",
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS, prompts=PROMPTS)
    check(tiny_llama, run, oracle, "eagle", "spec-decode-eagle")
    assert next(d for d in run["report"]["decisions"] if d["family"] == "attention_backend")["chosen"] == "vllm-native"
    if capture_mode == "piecewise":
        assert set(run["report"]["trace"]["attention_states"]) == {"PrefillNoCache", "ChunkedPrefill"}
    graph = run["report"]["graph"]
    assert graph["capture_mode"] == capture_mode and sum(graph["replays"].values()) > 0, graph

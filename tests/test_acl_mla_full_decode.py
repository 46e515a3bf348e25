"""FULL_DECODE_ONLY for MLA: the real Ascend MLA builder and impl inside the real ACL wrapper.

A two-layer latent-attention decoder calls the real :class:`AscendMLAImpl`
(its cache write and its weight-absorbed decode, ``forward_mqa``) with the
metadata the real :class:`AscendMLAMetadataBuilder` builds for each step, as
vLLM's MLA layer does. It is wrapped in the real :class:`AclGraphWrapper`
(runtime mode FULL) on the recording stand-in of the device graphs
(``tests/graph_standin.py``) with the reference ops provider: captured once
at the padded size, then replayed over steps with other sequence lengths.

Oracles: the same decoder run eagerly (the reference provider's
``paged_attention_mla``) and an independent one, plain torch softmax
attention over each request's latent rows gathered by its block table. A
replay whose MLA tasks were not re-issued with the step's lengths fails on
the stand-in (``StaleTaskParamError``), as the NPU would silently use the
capture's lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from acl_decode_harness import (
    BLOCK, HIDDEN, LAYERS, MAX_BLOCKS, N, NUM_BLOCKS, TABLE, CountingDecoder, Layer, Piece, Runner,
    check_a_stale_replay_is_caught, check_one_task_per_layer, check_piecewise_decode,
    check_replays_equal_eager_and_oracle, forward, full_graph_fixture, kernel, modes, stepper,
)
from graph_standin import RecordingGraphDevice, capturing


H, RANK, ROPE = 4, 512, 64  # DeepSeek's latent sizes (vLLM's MLA checks them)
LATENT = RANK + ROPE
SCALE = (128 + ROPE) ** -0.5
MLA_OP = "ascend_kernel::paged_attention_mla_out"


class PrefillBackendStandin:
    """What vLLM's MLA builder copies from its layer's prefill backend; decode-only steps never use it."""

    def clone(self) -> "PrefillBackendStandin":
        return self


@dataclass
class LayerDims:
    """The MLA sizes vLLM's builder reads from a layer in the static forward context."""

    q_lora_rank: int | None = None
    kv_lora_rank: int = RANK
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = ROPE
    v_head_dim: int = 128
    prefill_backend: Any = None


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model

    path = create_tiny_model("deepseek_v2", tmp_path_factory.mktemp("model") / "deepseek_v2")
    config = VllmConfig(model_config=ModelConfig(model=str(path), max_model_len=MAX_BLOCKS * BLOCK))
    for name in LAYERS:
        config.compilation_config.static_forward_context[name] = LayerDims(prefill_backend=PrefillBackendStandin())
    return config


def weights(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Per layer: the absorbed query (nope + rope per head), the latent KV row, the output projection."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (HIDDEN, H * LATENT), "kv": (HIDDEN, LATENT), "o": (H * RANK, HIDDEN)}
    return [{name: torch.randn(*shape, generator=g) / shape[0] ** 0.5 for name, shape in shapes.items()}
            for _ in LAYERS]


def fresh_caches(seed: int = 1) -> list[torch.Tensor]:
    """vLLM's MLA cache per layer, [blocks, block tokens, rank + rope], holding earlier tokens' latent rows."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(NUM_BLOCKS, BLOCK, LATENT, generator=g) for _ in LAYERS]


def mla_layer(impl, name: str, w: dict[str, torch.Tensor], cache: torch.Tensor, meta, h: torch.Tensor):
    """One layer's MLA: the cache write and the decode through the real impl, as vLLM's MLA layer calls them."""
    latent = h @ w["kv"]
    impl.do_kv_cache_update(latent[:, :RANK], latent[:, RANK:], cache, meta.slot_mapping, "auto", None)
    q = (h @ w["q"]).view(-1, H, LATENT)
    out, lse = impl.forward_mqa((q[..., :RANK], q[..., RANK:]), cache, meta, Layer(name))
    assert lse is None
    return out


class Decoder(CountingDecoder):
    """Two MLA decoder layers (the real Ascend MLA impl, output projection, residual); counts its Python calls."""

    def layer(self, name, w, cache, meta, h):
        out = mla_layer(self.impl, name, w, cache, meta, h)
        return h + out.reshape(h.shape[0], H * RANK) @ w["o"]


def softmax_oracle(w, caches, x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """The real requests' outputs by plain softmax attention over each request's latent rows.

    Keys are whole latent rows, values their first ``RANK`` columns. Writes
    the step's latent rows into ``caches`` first (plain indexing, its own
    copy of the cache history).
    """
    h = x.clone()
    for w_l, cache in zip(w, caches):
        q = (h @ w_l["q"]).view(-1, H, LATENT)
        latent = h @ w_l["kv"]
        rows = []
        for r, length in enumerate(lens):
            pos = length - 1
            cache[int(TABLE[r, pos // BLOCK]), pos % BLOCK] = latent[r]
            positions = torch.arange(length)
            keys = cache[TABLE[r, positions // BLOCK].long(), positions % BLOCK]  # [L, LATENT]
            probs = torch.softmax((q[r] @ keys.T) * SCALE, dim=-1)  # [H, L]
            rows.append((probs @ keys[:, :RANK]).reshape(H * RANK))
        h = h + torch.stack(rows) @ w_l["o"]
    return h


def make_impl():
    from ascend_kernel_plugins.attention.ascend.mla import AscendMLAImpl

    return AscendMLAImpl(H, LATENT, SCALE, 1, None, None, "auto", None, "decoder", None, q_lora_rank=None,
                         kv_lora_rank=RANK, qk_nope_head_dim=128, qk_rope_head_dim=ROPE, qk_head_dim=128 + ROPE,
                         v_head_dim=128, kv_b_proj=None)


def make_builder(vllm_config):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_kernel_plugins.attention.ascend.mla import AscendMLAMetadataBuilder

    spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=LATENT, dtype=torch.float32)
    return AscendMLAMetadataBuilder(spec, list(LAYERS), vllm_config, torch.device("cpu"))


full_graph = full_graph_fixture(Decoder, make_impl, weights, fresh_caches, make_builder)
run_step = stepper(softmax_oracle)


def test_capture_records_one_updatable_mla_task_per_layer(full_graph):
    from ascend_kernel_plugins.attention.ascend.graph_params import MLA_LENGTHS, decode_graph_params

    tasks = check_one_task_per_layer(full_graph, MLA_OP, "latent cache write")
    assert all(t.op == "paged_attention_mla_out" and t.lengths_in == MLA_LENGTHS for t in tasks)
    device, impl, *_ = full_graph
    assert decode_graph_params(device, impl.ops).workspaces == {}, "the MLA kernel takes no workspace"


def test_mla_tasks_hold_query_and_output_through_weak_references(full_graph):
    from ascend_kernel_plugins.attention.ascend.graph_params import decode_graph_params

    device, impl, *_ = full_graph
    (graph,) = device.graphs
    for task in decode_graph_params(device, impl.ops).tasks[graph]:
        assert {id(task.args[0]), id(task.args[-1])} <= device.weak_refs, "query and output: the pool's"


def test_replays_with_new_lengths_equal_eager_and_softmax_oracle(full_graph, monkeypatch):
    def check_metadata(metadata, lens, runner):
        decode = metadata[LAYERS[0]].decode
        assert decode.host_seq_lens.tolist() == lens + [1] * (N - len(lens)), "padded requests read length 1"
        assert decode.host_seq_lens.data_ptr() == runner.builder.host_lengths.buffer.data_ptr()

    check_replays_equal_eager_and_oracle(full_graph, lambda lens, x: run_step(monkeypatch, full_graph, lens, x),
                                         check_metadata)


def test_a_replay_without_the_update_is_caught(full_graph, monkeypatch):
    check_a_stale_replay_is_caught(full_graph, lambda lens, x: run_step(monkeypatch, full_graph, lens, x),
                                   "paged_attention_mla_out")


def test_full_capture_refuses_a_batch_other_than_the_size_it_captures(kernel, vllm_config):
    """A decode of fewer requests than the captured size would freeze a batch vLLM never replays: refused."""
    from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper

    impl, w, caches = make_impl(), weights(), fresh_caches()
    runner = Runner(make_builder(vllm_config))
    metadata = runner.capture_step()
    meta = metadata[LAYERS[0]]
    decode = meta.decode
    two_per_request = type(decode)(decode.block_table[:2], decode.seq_lens[:2], None,
                                   host_seq_lens=decode.host_seq_lens[:2])
    short = {name: type(meta)(**{**vars(meta), "decode": two_per_request}) for name in LAYERS}

    def attention_only(x):  # two requests, one token each, inside a capture of size N
        q = (x[:2] @ w[0]["q"]).view(-1, H, LATENT)
        return impl.forward_mqa(q, caches[0], short[LAYERS[0]], Layer(LAYERS[0]))[0]

    device = RecordingGraphDevice()
    wrapper = AclGraphWrapper(attention_only, None, modes().FULL, device=device)
    with capturing(), forward(modes().FULL, short), pytest.raises(NotImplementedError, match="MLA backend captures"):
        wrapper(runner.x)
    assert not device.graphs[0].groups


# -- PIECEWISE: attention runs eagerly between captured pieces; nothing to update -------------


def test_piecewise_runs_mla_eagerly_and_records_no_task_groups(kernel, vllm_config, monkeypatch):
    from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper

    device, impl, w, caches = RecordingGraphDevice(), make_impl(), weights(), fresh_caches()
    oracle_caches = [c.clone() for c in caches]
    wrap = lambda fn: AclGraphWrapper(Piece(fn), None, modes().PIECEWISE, device=device)  # noqa: E731
    heads_out = [torch.zeros(N, H, RANK) for _ in LAYERS]  # attention's result copied in: the next piece's input
    out_proj = [wrap(lambda h, a, w_l=w_l: h + a.reshape(N, H * RANK) @ w_l["o"]) for w_l in w]

    def model(x: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        h = x
        for i, name in enumerate(LAYERS):
            heads_out[i].copy_(mla_layer(impl, name, w[i], caches[i], metadata[name], h))
            h = out_proj[i](h, heads_out[i])
        return h

    check_piecewise_decode(monkeypatch, device, model, Runner(make_builder(vllm_config)),
                           lambda x, lens: softmax_oracle(w, oracle_caches, x, lens), 2, MLA_OP)


# -- the pieces: support declarations, the op, the torch_npu call ------------------------------


def test_mla_declares_single_token_decode_on_an_npu_and_sfa_still_none(monkeypatch):
    from vllm.v1.attention.backend import AttentionCGSupport

    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel_plugins.attention.ascend.mla import AscendMLAMetadataBuilder
    from ascend_kernel_plugins.attention.ascend.sfa import AscendSFAMetadataBuilder

    for kind, mla, sfa in (("npu", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, AttentionCGSupport.NEVER),
                           ("cpu", AttentionCGSupport.UNIFORM_BATCH, AttentionCGSupport.UNIFORM_BATCH)):
        monkeypatch.setattr(kernel_mod, "_current", SimpleNamespace(device=SimpleNamespace(kind=kind)))
        assert AscendMLAMetadataBuilder.get_cudagraph_support(None, None) == mla, kind
        assert AscendSFAMetadataBuilder.get_cudagraph_support(None, None) == sfa, kind


def test_the_mla_out_op_holds_its_lengths_and_writes_what_the_eager_op_returns():
    from ascend_kernel.ops.graph_ops import HOST_PARAMS
    from ascend_kernel.ops.reference import ReferenceOps

    assert HOST_PARAMS[MLA_OP] == ("context_lens",)
    names = [a.name for a in torch.ops.ascend_kernel.paged_attention_mla_out.default._schema.arguments]
    assert names[1:] == ["query", "kv_cache", "block_table", "context_lens", "scale", "num_heads", "v_head_size",
                         "out"]
    ops, g = ReferenceOps(), torch.Generator().manual_seed(5)
    query, cache = torch.randn(3, H, LATENT, generator=g), torch.randn(NUM_BLOCKS, BLOCK, 1, LATENT, generator=g)
    lens = torch.tensor([1, 16, 40], dtype=torch.int32)
    out = torch.full((3, H, RANK), float("nan"))
    ops.paged_attention_mla_out(query, cache, TABLE[:3], lens, SCALE, H, RANK, out)
    torch.testing.assert_close(out, ops.paged_attention_mla(query, cache, TABLE[:3], lens, SCALE, H, RANK))


class RecordingTorchNpu:
    """Records the keyword calls the torch_npu provider makes (no NPU here)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str):
        return lambda **kwargs: self.calls.append((name, kwargs))


def test_the_npu_provider_calls_the_documented_mla_kernel_without_a_workspace():
    from ascend_kernel.ops.npu import TorchNpuOps

    ops = TorchNpuOps.__new__(TorchNpuOps)  # its __init__ imports torch_npu
    ops._npu = RecordingTorchNpu()
    query, cache, lens, out = torch.zeros(2, H, LATENT), torch.zeros(3, BLOCK, 1, LATENT), torch.ones(2), object()
    ops.paged_attention_mla_out(query, cache, TABLE[:2], lens, SCALE, H, RANK, out)
    ((name, kwargs),) = ops._npu.calls
    assert name == "_npu_paged_attention_mla"
    assert list(kwargs) == ["query", "key_cache", "num_kv_heads", "num_heads", "scale_value", "block_table",
                            "context_lens", "mla_vheadsize", "out"]
    assert kwargs["key_cache"] is cache and kwargs["context_lens"] is lens and kwargs["out"] is out
    assert (kwargs["num_kv_heads"], kwargs["num_heads"], kwargs["mla_vheadsize"]) == (1, H, RANK)

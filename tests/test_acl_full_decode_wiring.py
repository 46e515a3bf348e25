"""FULL_DECODE_ONLY wired end to end: the real Ascend builder and impl inside the real ACL wrapper.

A two-layer decoder calls the real :class:`AscendAttentionImpl` with the
metadata vLLM's forward context carries for each layer, as vLLM's attention
layer does. A small runner writes each step into persistent buffers (as
vLLM's runner does, padded requests at length 0 and the null block) and the
real :class:`AscendMetadataBuilder` builds the step's metadata. The model is
wrapped in the real :class:`AclGraphWrapper` (runtime mode FULL) on the
recording stand-in of the device graphs (``tests/graph_standin.py``) and the
reference ops provider: captured once at the padded size, then replayed over
steps with other sequence lengths.

Oracles: the same model run eagerly (the reference paged attention) and an
independent one, torch SDPA over each request's cached K/V gathered by its
block table. What would break on a device is checked against the stand-in:
a replay whose attention tasks were not re-issued with the step's lengths
fails (``StaleTaskParamError``), as the NPU would silently use the capture's.
"""

from __future__ import annotations


import pytest
import torch
from acl_decode_harness import (
    BLOCK, HIDDEN, LAYERS, MAX_BLOCKS, N, NUM_BLOCKS, STEPS, TABLE, CountingDecoder, Layer, Piece, Runner,
    check_a_stale_replay_is_caught, check_one_task_per_layer, check_piecewise_decode,
    check_replays_equal_eager_and_oracle, forward, full_graph_fixture, kernel, modes, stepper,
)
from graph_standin import RecordingGraphDevice, capturing

from ascend_kernel_plugins.attention.states import AttentionState

H, KVH, D = 4, 2, 16
assert HIDDEN == H * D


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model

    path = create_tiny_model("llama", tmp_path_factory.mktemp("model") / "llama")
    return VllmConfig(model_config=ModelConfig(model=str(path), max_model_len=MAX_BLOCKS * BLOCK))


def weights(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{name: torch.randn(HIDDEN, out, generator=g) / HIDDEN ** 0.5
             for name, out in (("q", HIDDEN), ("k", KVH * D), ("v", KVH * D), ("o", HIDDEN))} for _ in LAYERS]


def fresh_caches(seed: int = 1) -> list[torch.Tensor]:
    """vLLM's page view per layer, [blocks, kv_heads, block tokens, 2 * head size], holding earlier tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(NUM_BLOCKS, KVH, BLOCK, 2 * D, generator=g) for _ in LAYERS]


class Decoder(CountingDecoder):
    """Two decoder layers (projections, the real Ascend attention impl, residual); counts its Python calls."""

    def layer(self, name, w, cache, meta, h):
        out = torch.empty(h.shape[0], HIDDEN)
        self.impl.forward(Layer(name), h @ w["q"], h @ w["k"], h @ w["v"], cache, meta, out)
        return h + out @ w["o"]


def sdpa_oracle(w, caches, x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """The real requests' outputs, by torch SDPA over each request's cached K/V.

    Writes the step's K/V into ``caches`` first (plain indexing, as its own
    copy of the cache history).
    """
    h = x.clone()
    for w_l, cache in zip(w, caches):
        q = (h @ w_l["q"]).view(-1, H, D)
        k, v = (h @ w_l["k"]).view(-1, KVH, D), (h @ w_l["v"]).view(-1, KVH, D)
        rows = []
        for r, length in enumerate(lens):
            pos = length - 1
            block, offset = int(TABLE[r, pos // BLOCK]), pos % BLOCK
            cache[block, :, offset, :D], cache[block, :, offset, D:] = k[r], v[r]
            positions = torch.arange(length)
            blocks, offsets = TABLE[r, positions // BLOCK].long(), positions % BLOCK
            keys = cache[blocks, :, offsets, :D].repeat_interleave(H // KVH, dim=1)  # [L, H, D]
            values = cache[blocks, :, offsets, D:].repeat_interleave(H // KVH, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q[r].unsqueeze(1), keys.transpose(0, 1), values.transpose(0, 1), scale=D ** -0.5)  # [H, 1, D]
            rows.append(out.reshape(HIDDEN))
        h = h + torch.stack(rows) @ w_l["o"]
    return h


def make_impl():
    from ascend_kernel_plugins.attention.ascend.backend import AscendAttentionImpl

    return AscendAttentionImpl(H, D, D ** -0.5, KVH, None, None, "auto")


def make_builder(vllm_config):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from ascend_kernel_plugins.attention.ascend.backend import AscendMetadataBuilder

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KVH, head_size=D, dtype=torch.float32)
    return AscendMetadataBuilder(spec, list(LAYERS), vllm_config, torch.device("cpu"))


full_graph = full_graph_fixture(Decoder, make_impl, weights, fresh_caches, make_builder)
run_step = stepper(sdpa_oracle)


def test_capture_records_one_updatable_attention_task_per_layer(full_graph):
    # decided a fresh prefill (length-1 dummy requests), the capture still took the decode
    check_one_task_per_layer(full_graph, "ascend_kernel::paged_attention_out", "cache write")


def test_tasks_hold_the_capture_memory_only_through_weak_references(full_graph, monkeypatch):
    """Query, output and workspace of every captured layer are held as the device's weak references (the
    graph's pool owns them); the workspace is held strongly only while its graph is being captured."""
    from ascend_kernel_plugins.attention.ascend.graph_params import decode_graph_params

    device, impl, *_ = full_graph
    params = decode_graph_params(device, impl.ops)
    (graph,) = device.graphs
    for task in params.tasks[graph]:
        query, out, workspace = task.args[0], task.args[8], task.args[9]
        assert {id(query), id(out)} <= device.weak_refs
        assert workspace is None or id(workspace) in device.weak_refs
    assert all(w is None or id(w) in device.weak_refs for w in params.workspaces.values())
    run_step(monkeypatch, full_graph, STEPS[0], torch.randn(len(STEPS[0]), HIDDEN))
    assert params._pinned == {}, "after the capture (a replay ran) no workspace is held strongly"


def test_replays_with_new_lengths_equal_eager_and_sdpa(full_graph, monkeypatch):
    def check_metadata(metadata, lens, runner):
        meta = metadata[LAYERS[0]]
        assert meta.attn_state is AttentionState.DecodeOnly
        assert meta.seq_lens.tolist() == lens + [1] * (N - len(lens)), "padded requests read length 1 (null block)"

    check_replays_equal_eager_and_oracle(full_graph, lambda lens, x: run_step(monkeypatch, full_graph, lens, x),
                                         check_metadata)


def test_a_replay_without_the_update_is_caught(full_graph, monkeypatch):
    check_a_stale_replay_is_caught(full_graph, lambda lens, x: run_step(monkeypatch, full_graph, lens, x),
                                   "paged_attention_out")


def test_clearing_the_wrappers_graphs_forgets_their_tasks(full_graph):
    from ascend_kernel_plugins.attention.ascend.graph_params import decode_graph_params

    device, impl, *_, wrapper, _ = full_graph
    params = decode_graph_params(device, impl.ops)
    assert params.tasks
    wrapper.clear_graphs()
    assert params.tasks == {} and params.workspaces == {}


def test_full_capture_refuses_what_its_lengths_would_freeze(kernel, vllm_config):
    """A FULL capture of a batch that is not one token per request would bake its lengths in: refused."""
    from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper

    device, impl = RecordingGraphDevice(), make_impl()
    wrapper = AclGraphWrapper(Decoder(impl, weights(), fresh_caches()), None, modes().FULL, device=device)
    runner = Runner(make_builder(vllm_config))
    metadata = runner.capture_step()
    meta = metadata[LAYERS[0]]
    two_per_request = {name: type(meta)(N, meta.attn_state, meta.query_lens, meta.seq_lens[:2], meta.block_table[:2],
                                        meta.slot_mapping, None) for name in LAYERS}
    with capturing(), forward(modes().FULL, two_per_request), pytest.raises(NotImplementedError, match="single-token"):
        wrapper(runner.x)


# -- PIECEWISE: attention runs eagerly between captured pieces; nothing to update -------------


def test_piecewise_runs_attention_eagerly_and_issues_no_task_updates(kernel, vllm_config, monkeypatch):
    from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper

    device, impl, w, caches = RecordingGraphDevice(), make_impl(), weights(), fresh_caches()
    oracle_caches = [c.clone() for c in caches]
    wrap = lambda fn: AclGraphWrapper(Piece(fn), None, modes().PIECEWISE, device=device)  # noqa: E731
    qkv = [wrap(lambda h, w_l=w_l: (h @ w_l["q"], h @ w_l["k"], h @ w_l["v"])) for w_l in w]
    out_proj = [wrap(lambda h, a, w_l=w_l: h + a @ w_l["o"]) for w_l in w]
    attn_out = [torch.zeros(N, HIDDEN) for _ in LAYERS]  # attention writes in place: the next piece's input stays put

    def model(x: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        h = x
        for i, name in enumerate(LAYERS):
            q, k, v = qkv[i](h)
            impl.forward(Layer(name), q, k, v, caches[i], metadata[name], attn_out[i])
            h = out_proj[i](h, attn_out[i])
        return h

    check_piecewise_decode(monkeypatch, device, model, Runner(make_builder(vllm_config)),
                           lambda x, lens: sdpa_oracle(w, oracle_caches, x, lens), 4, "ascend_kernel::paged_attention_out")


def test_a_workspace_is_held_strongly_only_while_its_graph_is_captured():
    """Inside one capture a freed block may go to the capture's next allocation: the workspace every layer of
    the graph shares stays pinned until that capture is over, then only the weak reference remains."""
    from ascend_kernel_plugins.attention.ascend.graph_params import DecodeGraphParams

    class WorkspaceOps:  # the one op the workspace table asks (an NPU provider sizes a real workspace there)
        def paged_attention_workspace(self, *args):
            return torch.empty(64)

    device = RecordingGraphDevice()
    params = DecodeGraphParams(device, WorkspaceOps())
    q, cache, table, lens = torch.zeros(2, H, D), torch.zeros(4, BLOCK, KVH, D), torch.zeros(2, 3), torch.ones(2)
    first = params._workspace("graph-1", q, cache, cache, table, lens, 1.0, H, KVH, q)
    assert params._workspace("graph-1", q, cache, cache, table, lens, 1.0, H, KVH, q) is first, "shared by layers"
    assert id(first) in device.weak_refs and [id(w) for w in params._pinned["graph-1"]] == [id(first)]
    params._workspace("graph-2", q, cache, cache, table, lens, 1.0, H, KVH, q)
    assert list(params._pinned) == ["graph-2"], "capturing graph-2 means graph-1's capture is over"
    params.before_replay("graph-2", None)
    assert params._pinned == {}

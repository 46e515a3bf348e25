"""Where a compiled MoE layer traces its routed experts (plugins/moe_comm/traced_experts.py), and the selector's
reachable methods it reads. The policy is the real one bound to the real built-in methods (no vLLM engine)."""

from __future__ import annotations

import pytest
import torch

from ascend_kernel.ops import get_ops, moe_cpu
from ascend_kernel.ops.moe_experts import LocalExperts
from ascend_kernel.ops.moe_parallel import MoEParallel
from ascend_kernel_plugins.moe_comm import traced_experts
from ascend_kernel_plugins.moe_comm.methods.allgather import AllGatherMethod
from ascend_kernel_plugins.moe_comm.methods.alltoall import AllToAllMethod
from ascend_kernel_plugins.moe_comm.methods.base import MoECommMethod
from ascend_kernel_plugins.moe_comm.methods.mc2 import MC2Method
from ascend_kernel_plugins.moe_comm.methods.naive_multicast import NaiveMulticastMethod
from ascend_kernel_plugins.moe_comm.policy import AscendMoECommPolicy

ops = get_ops("reference", "cpu")
EXPERTS, HIDDEN, INTER, TOP_K = 4, 32, 16, 2
needs_kernel = pytest.mark.skipif(moe_cpu.unserved_reason(torch.zeros(1, 2, 32), torch.zeros(1, 32, 1)) is not None,
                                  reason="vLLM-CPU's fused MoE kernel is not built here")


def table():
    return {"allgather": AllGatherMethod(ops), "naive_multicast": NaiveMulticastMethod(ops),
            "alltoall": AllToAllMethod(ops), "mc2": MC2Method(ops, 8)}


def policy(forced: str | None = None, expert_parallel: bool = False, soc: str | None = None):
    rules = AscendMoECommPolicy(is_moe=True, expert_parallel=expert_parallel, soc=soc, capacity=8, world_size=1,
                                min_mc2_world=16, w4a8=False, allgather_only=False, sequence_parallel=False)
    return rules.bind(table(), forced)


def experts(hidden: int = HIDDEN) -> LocalExperts:
    gen = torch.Generator().manual_seed(3)
    w13 = torch.randn(EXPERTS, 2 * INTER, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(EXPERTS, hidden, INTER, generator=gen) / INTER ** 0.5
    return LocalExperts.build(w13, w2, torch.arange(EXPERTS), EXPERTS, ops)


def reason(**overrides):
    args = dict(enabled=True, compiled=True, tp_size=1, parallel=MoEParallel.single(), experts=experts(),
                policy=policy(), eplb=None)
    args.update(overrides)
    return traced_experts.traced_experts_reason(**args)


def test_reachable_is_every_name_a_batch_can_get_with_its_fallbacks():
    assert [m.name for m in policy().selector.reachable()] == ["allgather", "naive_multicast"]
    assert [m.name for m in policy(forced="mc2").selector.reachable()] == ["alltoall", "mc2"]  # mc2 falls back
    assert [m.name for m in policy(expert_parallel=True, soc="A3").selector.reachable()] == ["alltoall", "mc2"]


@needs_kernel
def test_traced_only_at_one_rank_on_the_fused_kernel_compiled_with_single_rank_methods():
    assert reason() is None
    assert "forced off: ASCEND_KERNEL_MOE_TRACE_EXPERTS=false" == reason(enabled=False)
    assert "not compiled" in reason(compiled=False)
    assert "keeps vLLM's own MoE kernel" in reason(experts=None)
    assert "TP=2" in reason(tp_size=2)
    two_ranks = MoEParallel(None, 0, 2, 0, 2)
    assert "EP=2" in reason(parallel=two_ranks)
    assert "EPLB" in reason(eplb=object())
    # hidden 24: vLLM-CPU's kernel does not serve it, the seam's grouped ops (data-dependent rows) would run
    assert "grouped ops" in reason(experts=experts(hidden=24))
    assert "mc2" in reason(policy=policy(forced="mc2")) and "alltoall" in reason(policy=policy(forced="mc2"))
    assert "does not say" in reason(policy=object())


@needs_kernel
def test_the_report_says_traced_only_when_every_layer_is():
    rules = policy()
    traced_experts.record(rules, None)
    assert rules.describe()["experts_under_compile"]["traced"] is True
    traced_experts.record(rules, "TP=2, EP=1: ...")
    traced_experts.record(rules, None)  # a later traced layer does not hide the opaque one
    assert rules.describe()["experts_under_compile"] == {"traced": False, "why": "TP=2, EP=1: ..."}


@needs_kernel
def test_traced_call_equals_every_single_rank_method_and_compiles_in_one_graph():
    """What the layer traces (single_rank_weighted_mlp) equals each reachable method's run at one rank, eagerly and
    compiled with fullgraph (no opaque seam op left: gating and the fused kernel are traced on a CPU provider)."""
    local = experts()
    gen = torch.Generator().manual_seed(5)
    x, logits = torch.randn(6, HIDDEN, generator=gen), torch.randn(6, EXPERTS, generator=gen)

    def layer(x, logits):
        weights, ids = ops.moe_gating_top_k_softmax(logits, TOP_K)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return MoECommMethod.single_rank_weighted_mlp(x, weights, ids, local)

    weights, ids = ops.moe_gating_top_k_softmax(logits, TOP_K)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    for method in policy().selector.reachable():
        out, computed = method.run(x, weights, ids, local, MoEParallel.single())
        torch.testing.assert_close(layer(x, logits), out)
        assert computed == ids.numel()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=backend)
    torch.testing.assert_close(compiled(x, logits), layer(x, logits))
    assert len(graphs) == 1 and "_C.cpu_fused_moe" in graphs[0], graphs
    assert not any(op.startswith("ascend_kernel.") for op in graphs[0]), graphs[0]

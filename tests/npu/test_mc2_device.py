"""MC2 dispatch/combine through the torch_npu provider on the stand-in NPU (one EP rank), against a dense oracle."""

from __future__ import annotations

import pytest
import torch

from npu import fake_torch_npu
from npu.standin import DEVICE, host, npu

BS, K, E, H = 5, 2, 4, 8


class _HcclGroup:
    """A process group as the MC2 kernels address it: its HCCL backend for the npu device, by communicator name."""

    def _get_backend(self, device: torch.device):
        if device.type != "npu":
            raise RuntimeError(f"no backend for {device}")
        return type("Hccl", (), {"get_hccl_comm_name": staticmethod(lambda rank: f"hccl_ep_{rank}")})()


@pytest.mark.parametrize("masked", [False, True])
def test_dispatch_then_combine_is_the_weighted_sum_of_the_experts(npu_ops, masked):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BS, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(BS)]).to(torch.int64)
    scales = torch.rand(BS, K, generator=g)
    mask = torch.tensor([True, True, False, True, False]) if masked else None
    rows, counts, handle = npu_ops.moe_distribute_dispatch(npu(x), npu(ids), _HcclGroup(), 1, 0, E, global_bs=BS,
                                                           x_active_mask=None if mask is None else npu(mask))
    assert rows.device == DEVICE and host(counts).sum() == K * (3 if masked else BS)
    factor = torch.repeat_interleave(torch.arange(1, E + 1, dtype=torch.float32), host(counts))  # expert e: x(e+1)
    out_rows = host(rows).float()
    out_rows[: factor.numel()] *= factor[:, None]
    out = npu_ops.moe_distribute_combine(npu(out_rows.to(torch.bfloat16)), npu(ids), handle, npu(scales),
                                         _HcclGroup(), 1, 0, E, global_bs=BS,
                                         x_active_mask=None if mask is None else npu(mask))
    want = ((ids + 1).float() * scales).sum(-1, keepdim=True) * x.float()
    if masked:
        want[~mask] = 0
    torch.testing.assert_close(host(out).float(), want, rtol=2e-2, atol=2e-2)
    names = {c[0]: c for c in fake_torch_npu.CALLS}
    assert names["npu_moe_distribute_dispatch_v2"][1][2] == "hccl_ep_0"  # the group by its HCCL name


def test_mc2_at_two_ep_ranks_sends_tokens_to_the_experts_owners_and_back(npu_ops):
    """The kernel's MC2 method at EP=2 (two in-process ranks of a stand-in HCCL group, one token replica): each
    rank dispatches its shard of the batch, the kernels move every pair to the rank owning its expert and back,
    each rank's experts run on the rows they received; the ranks' partial outputs add up (vLLM's TP all-reduce)
    to the dense mixture of experts."""
    from ascend_kernel.ops.moe_experts import LocalExperts, slot_table
    from ascend_kernel.ops.moe_parallel import MoEParallel
    from ascend_kernel_plugins.moe_comm.methods.mc2 import MC2Method

    from npu.standin_hccl import Fabric, run_ranks

    world, local, inter, tokens = 2, E // 2, 6, 7
    g = torch.Generator().manual_seed(5)
    w13 = (torch.randn(E, 2 * inter, H, generator=g) * 0.3).to(torch.bfloat16)  # vLLM's layouts
    w2 = (torch.randn(E, H, inter, generator=g) * 0.3).to(torch.bfloat16)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, K, generator=g), dim=-1)
    slots = slot_table(torch.tensor([[e - r * local if r * local <= e < (r + 1) * local else -1 for e in range(E)]
                                     for r in range(world)]), local)
    fabric = Fabric(world)

    def rank(r: int):
        experts = LocalExperts.build(npu(w13[r * local:(r + 1) * local]), npu(w2[r * local:(r + 1) * local]),
                                     slots, local, npu_ops, allow_fused=False)
        parallel = MoEParallel(groups[r], r, world, r, world)
        out, computed = MC2Method(npu_ops, capacity=8).run(npu(x), npu(weights), npu(ids), experts, parallel)
        assert out.device == DEVICE
        return host(out).double(), int(host(computed))

    with fabric.groups() as groups:
        outs = run_ranks(world, rank)
    want = torch.zeros(tokens, H, dtype=torch.float64)
    for t in range(tokens):
        for j in range(K):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ x[t].double()
            want[t] += float(weights[t, j]) * (w2[e].double() @ (torch.nn.functional.silu(gate_up[:inter])
                                                                 * gate_up[inter:]))
    torch.testing.assert_close(outs[0][0] + outs[1][0], want, rtol=3e-2, atol=3e-2)
    owners = torch.tensor([[int(e) // local for e in row] for row in ids])
    assert [o[1] for o in outs] == [int((owners == r).sum()) for r in range(world)]  # each pair on its owner once
    dispatches = [c for c in fake_torch_npu.CALLS if c[0] == "npu_moe_distribute_dispatch_v2"]
    assert sorted((c[1][2], c[1][3], c[1][4]) for c in dispatches) == [(fabric.name, 2, 0), (fabric.name, 2, 1)]

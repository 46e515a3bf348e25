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

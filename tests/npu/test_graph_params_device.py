"""ACL graph params (FULL_DECODE_ONLY): a decode task issued in a task group, re-issued with new host lengths.

On the stand-in NPU with the fake torch_npu's ``_npu_paged_attention`` (host
int32 lengths, everything else on the device): the kernel's
``DecodeGraphParams`` issues the task in a task group on the capture stream,
and ``update`` re-issues it inside ``graph_task_update`` with the step's
lengths; the output equals float64 attention over the new lengths.
"""

from __future__ import annotations

import torch

from npu import fake_torch_npu
from npu.standin import host, npu

B, HEADS, KV_HEADS, D, BLOCK, BLOCKS = 2, 4, 2, 8, 4, 6


def _naive(q, kc, vc, table, lens, scale):
    group = HEADS // KV_HEADS
    out = torch.zeros(B, HEADS, D, dtype=torch.float64)
    for b, n in enumerate(lens.tolist()):
        slots = torch.cat([table[b, i] * BLOCK + torch.arange(BLOCK) for i in range(table.shape[1])])[:n]
        k = kc.reshape(-1, KV_HEADS, D)[slots].double().repeat_interleave(group, 1)
        v = vc.reshape(-1, KV_HEADS, D)[slots].double().repeat_interleave(group, 1)
        w = torch.softmax((q[b].double()[None] * k).sum(-1) * scale, dim=0)  # [L, heads]
        out[b] = (w[..., None] * v).sum(0)
    return out


def test_decode_task_is_reissued_with_the_steps_lengths(npu_ops, standin_module):
    from ascend_kernel.device import Device
    from ascend_kernel_plugins.attention.ascend.graph_params import DecodeGraphParams

    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, HEADS, D, generator=g).to(torch.bfloat16)
    kc = torch.randn(BLOCKS, BLOCK, KV_HEADS, D, generator=g).to(torch.bfloat16)
    vc = torch.randn(BLOCKS, BLOCK, KV_HEADS, D, generator=g).to(torch.bfloat16)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    out = npu(torch.zeros(B, HEADS, D, dtype=torch.bfloat16))
    params = DecodeGraphParams(Device("npu"), npu_ops)
    first = torch.tensor([3, 5], dtype=torch.int32)
    params.paged_attention("graph", npu(q), npu(kc), npu(vc), npu(table), first, 0.3, HEADS, KV_HEADS, out,
                           layer_name="layers.0")
    torch.testing.assert_close(host(out).double(), _naive(q, kc, vc, table, first, 0.3), rtol=2e-2, atol=2e-2)
    assert standin_module.calls[-2:] == ["graph_task_group_begin", "graph_task_group_end"]
    step = torch.tensor([12, 2], dtype=torch.int32)
    assert params.update("graph", step) == 1
    torch.testing.assert_close(host(out).double(), _naive(q, kc, vc, table, step, 0.3), rtol=2e-2, atol=2e-2)
    assert "graph_task_update_begin:handle-1" in standin_module.calls and "event.record" in standin_module.calls
    workspace = [c for c in fake_torch_npu.CALLS if c[0] == "_npu_paged_attention_get_workspace"]
    assert workspace[0][2]["context_lens"].tolist() == [12, 12]  # sized for the longest lengths a replay can see

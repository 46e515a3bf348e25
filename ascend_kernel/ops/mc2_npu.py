"""MC2 dispatch/combine through torch_npu's fused kernels (NPU only, not run in CI).

``npu_moe_distribute_dispatch_v2`` / ``npu_moe_distribute_combine_v2`` take the
EP group by its HCCL communicator name and exchange tokens inside the kernel.
The dispatch outputs that only combine reads (``assist_info_for_combine``,
``ep_recv_counts``, ``tp_recv_counts``, ``expand_scales``) travel in the handle,
untouched: their contents differ between SoCs and releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class NpuMC2Handle:
    assist_info_for_combine: torch.Tensor
    ep_recv_counts: torch.Tensor
    tp_recv_counts: torch.Tensor | None
    expand_scales: torch.Tensor | None


def hccl_comm_name(group: Any, rank: int) -> str:
    """The HCCL communicator name the MC2 kernels address a process group by."""
    from ascend_kernel.upstream import process_group_backend

    return process_group_backend(group, torch.device("npu")).get_hccl_comm_name(rank)


class TorchNpuMC2Ops:
    """Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps` (uses ``self._npu``)."""

    def moe_distribute_dispatch(self, x, expert_ids, group, ep_world_size, ep_rank_id, moe_expert_num, *,
                                global_bs, x_active_mask=None):
        expand_x, _, assist, token_nums, ep_recv, tp_recv, expand_scales = self._npu.npu_moe_distribute_dispatch_v2(
            x, expert_ids.to(torch.int32), hccl_comm_name(group, ep_rank_id), ep_world_size, ep_rank_id,
            moe_expert_num, x_active_mask=x_active_mask, global_bs=global_bs, expert_token_nums_type=1)
        return expand_x, token_nums, NpuMC2Handle(assist, ep_recv, tp_recv, expand_scales)

    def moe_distribute_combine(self, expand_x, expert_ids, handle, expert_scales, group, ep_world_size, ep_rank_id,
                               moe_expert_num, *, global_bs, x_active_mask=None):
        return self._npu.npu_moe_distribute_combine_v2(
            expand_x, expert_ids.to(torch.int32), handle.assist_info_for_combine, handle.ep_recv_counts,
            expert_scales.to(torch.float32), hccl_comm_name(group, ep_rank_id), ep_world_size, ep_rank_id,
            moe_expert_num, tp_send_counts=handle.tp_recv_counts, x_active_mask=x_active_mask,
            expand_scales=handle.expand_scales, global_bs=global_bs)

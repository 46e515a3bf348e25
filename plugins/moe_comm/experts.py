"""This rank's experts: their weights in grouped-matmul layout, where every expert lives, the expert MLP.

Comm methods work in **slot ids**: rank ``r``'s ``i``-th local expert is slot
``r * local_experts + i``, so the owner of a slot is ``slot // local_experts``
(the layout Ascend's MC2 and all-to-all kernels assume). ``slot_of`` maps the
model's global expert ids to slots whatever vLLM's placement strategy was
(linear, round robin, EPLB's), from every rank's expert map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class LocalExperts:
    """The experts one rank computes, and the map from global expert ids to slots."""

    w13: torch.Tensor  # [local, hidden, 2 * intermediate]: gate then up, as vLLM's w13 rows
    w2: torch.Tensor  # [local, intermediate, hidden]
    slot_of: torch.Tensor  # [global experts] int64
    local_experts: int
    ops: Any

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Expert MLP over rows grouped by local expert (``counts[i]`` rows for expert ``i``)."""
        counts = counts[: self.w13.shape[0]].to(torch.int64)
        hidden = self.ops.grouped_matmul(rows, self.w13, counts)
        return self.ops.grouped_matmul(self.ops.swiglu(hidden), self.w2, counts)


def slot_table(local_maps: torch.Tensor, local_experts: int) -> torch.Tensor:
    """Global id -> slot, from each rank's map ``local_maps[r][e]`` (local index on rank r, or -1)."""
    ranks, experts = torch.nonzero(local_maps >= 0, as_tuple=True)
    if torch.bincount(experts, minlength=local_maps.shape[1]).ne(1).any():
        raise ValueError("every expert must live on exactly one rank of the EP group (redundant experts are not "
                         "supported by the kernel's MoE comm methods)")
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

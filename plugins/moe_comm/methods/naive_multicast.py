"""Naive multicast: the data-parallel broadcast form of all-gather.

Each rank of the token group broadcasts its own batch to the others (one
broadcast per rank, no padding to a common size), every rank computes its own
experts over all tokens, and the partial outputs are all-reduced over the token
group, each rank keeping its own rows. With one token-group rank (DP = 1, or
inside vLLM, whose MoE runner gathers DP batches itself) it is all-gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.moe_comm.methods.allgather import AllGatherMethod
from ascend_kernel_plugins.moe_comm.methods.common import broadcast_batches, own_rows, seam_ops


class NaiveMulticastMethod(AllGatherMethod):
    name = "naive_multicast"

    def gather(self, tensors, parallel):
        return broadcast_batches(tensors, parallel)

    def scatter(self, partial: torch.Tensor, sizes: list[int], parallel) -> torch.Tensor:
        if parallel.token_size == 1:
            return partial
        dist.all_reduce(partial, group=parallel.token_group)
        return partial[own_rows(sizes, parallel)]


@hookimpl
def ascend_kernel_moe_comm_methods():
    return [Implementation(family="moe_comm_method", name=NaiveMulticastMethod.name,
                           factory=lambda ctx: NaiveMulticastMethod(seam_ops(ctx)),
                           description="each DP rank broadcasts its tokens; partials all-reduced (= allgather at DP 1)")]

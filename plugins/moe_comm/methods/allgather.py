"""All-gather: every rank routes every token and computes only its own experts.

The batches of the token group (data-parallel ranks holding different tokens)
are gathered, so every rank sees every token; each rank runs the (token,
expert) pairs whose expert it holds (``moe_init_routing`` with this rank's
active expert range), weights and sums them per token
(``moe_token_unpermute``), and a reduce-scatter over the token group sums the
ranks' partial outputs and hands each rank the rows of its own batch. Ranks
holding the same batch (tensor parallel) add up their partials in vLLM's TP
all-reduce. No capacity limit: the all-gather is what serves any batch.

With one token-group rank and every expert local (no expert parallelism,
the common case) there is nothing to gather or drop: :meth:`run` hands the
batch to the experts' weighted MLP in one call (vLLM-CPU's fused kernel on a
CPU host), skipping the routing and unpermute round trip.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.moe_comm.methods.base import Dispatched, MoECommMethod, slots_of
from ascend_kernel_plugins.moe_comm.methods.common import all_gather_batches, pad_rows, seam_ops


class AllGatherMethod(MoECommMethod):
    name = "allgather"
    single_rank_is_weighted_mlp = True  # and naive multicast, which inherits run()

    def gather(self, tensors: list[torch.Tensor], parallel: Any) -> tuple[list[torch.Tensor], list[int]]:
        return all_gather_batches(tensors, parallel)

    def scatter(self, partial: torch.Tensor, sizes: list[int], parallel: Any) -> torch.Tensor:
        """Sum partial outputs over the token group; keep this rank's rows (a reduce-scatter)."""
        if parallel.token_size == 1:
            return partial
        longest = max(sizes)
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
        blocks = torch.cat([pad_rows(partial[s:s + n], longest) for s, n in zip(starts, sizes)])
        out = partial.new_empty(longest, partial.shape[-1])
        dist.reduce_scatter_tensor(out, blocks.contiguous(), group=parallel.token_group)
        return out[: sizes[parallel.token_rank]]

    def run(self, hidden, topk_weights, topk_ids, experts, parallel) -> tuple[torch.Tensor, torch.Tensor | int]:
        if parallel.ep_size == 1 and parallel.token_size == 1:
            # every (token, expert) row is computed here, a count the host knows without reading the device
            return self.single_rank_weighted_mlp(hidden, topk_weights, topk_ids, experts), topk_ids.numel()
        return super().run(hidden, topk_weights, topk_ids, experts, parallel)

    def dispatch(self, hidden, topk_weights, topk_ids, experts, parallel) -> Dispatched:
        (hidden, weights, slots), sizes = self.gather([hidden, topk_weights, slots_of(topk_ids, experts)], parallel)
        first = parallel.ep_rank * experts.local_experts
        rows, row_idx, counts = self.ops.moe_init_routing(
            hidden, slots, parallel.ep_size * experts.local_experts, (first, first + experts.local_experts))
        return Dispatched(rows, counts, (row_idx, weights, sizes, parallel))

    def combine(self, expert_out, dispatched) -> torch.Tensor:
        row_idx, weights, sizes, parallel = dispatched.state
        partial = self.ops.moe_token_unpermute(expert_out, row_idx, weights)
        return self.scatter(partial, sizes, parallel)


@hookimpl
def ascend_kernel_moe_comm_methods() -> list[Implementation]:
    return [Implementation(family="moe_comm_method", name=AllGatherMethod.name,
                           factory=lambda ctx: AllGatherMethod(seam_ops(ctx)),
                           description="every rank routes all tokens over its own experts; partial outputs summed")]

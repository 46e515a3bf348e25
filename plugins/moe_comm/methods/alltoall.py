"""All-to-all: each rank keeps its share of the tokens and sends each (token, expert) pair to the expert's owner.

Ranks holding the same batch split it into shards. A rank sorts its shard's
pairs by expert (``moe_init_routing`` over every slot), tells every other rank
how many rows are coming (an all-to-all of counts), sends the rows (a
variable-split all-to-all), runs its experts on what it received, sends the
results back the same way, and weights and sums them per token
(``moe_token_unpermute``). Its combine returns its shard's rows, complete;
the rest of the batch is zero and arrives from the other shards' ranks in the
TP all-reduce. No capacity limit: buffers follow the exchanged counts.
"""

from __future__ import annotations

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.moe_comm.methods.base import Dispatched, MoECommMethod, place_shard, slots_of
from ascend_kernel_plugins.moe_comm.methods.common import seam_ops
from ascend_kernel.ops.moe_parallel import all_to_all_rows, exchange_counts


class AllToAllMethod(MoECommMethod):
    name = "alltoall"

    def dispatch(self, hidden, topk_weights, topk_ids, experts, parallel) -> Dispatched:
        start, end = parallel.shard(hidden.shape[0])
        local = experts.local_experts
        num_slots = parallel.ep_size * local
        rows, row_idx, per_slot = self.ops.moe_init_routing(
            hidden[start:end], slots_of(topk_ids[start:end], experts), num_slots, (0, num_slots))
        send = per_slot.view(parallel.ep_size, local).sum(1)
        recv = exchange_counts(send, parallel.ep_group, parallel.ep_size)
        send_counts, recv_counts = send.tolist(), recv.tolist()
        row_expert = torch.repeat_interleave(torch.arange(num_slots, device=rows.device) % local, per_slot)
        got_rows = all_to_all_rows(rows, send_counts, recv_counts, parallel.ep_group, parallel.ep_size)
        got_expert = all_to_all_rows(row_expert, send_counts, recv_counts, parallel.ep_group, parallel.ep_size)
        order = torch.argsort(got_expert, stable=True)
        counts = torch.bincount(got_expert, minlength=local).to(torch.int64)
        state = (start, hidden.shape[0], row_idx, topk_weights[start:end], send_counts, recv_counts, order, parallel)
        return Dispatched(got_rows[order], counts, state)

    def combine(self, expert_out, dispatched) -> torch.Tensor:
        start, num_tokens, row_idx, weights, send_counts, recv_counts, order, parallel = dispatched.state
        received_order = torch.empty_like(expert_out)
        received_order[order] = expert_out
        returned = all_to_all_rows(received_order, recv_counts, send_counts, parallel.ep_group, parallel.ep_size)
        shard_out = self.ops.moe_token_unpermute(returned, row_idx, weights)
        return place_shard(shard_out, start, num_tokens, parallel)


@hookimpl
def ascend_kernel_moe_comm_methods():
    return [Implementation(family="moe_comm_method", name=AllToAllMethod.name,
                           factory=lambda ctx: AllToAllMethod(seam_ops(ctx)),
                           description="token shards sent to the experts' owners and back (counts exchanged first)")]

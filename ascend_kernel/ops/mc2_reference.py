"""MC2 (fused MoE dispatch/combine) in plain torch over ``torch.distributed``.

Ascend's MC2 kernels (``npu_moe_distribute_dispatch_v2`` /
``npu_moe_distribute_combine_v2``) send every (token, expert) pair of a rank's
batch to the rank that owns the expert and bring the expert outputs back,
weighted and summed per token. What sets them apart from a plain all-to-all is
the **fixed capacity**: every buffer is sized for ``global_bs`` tokens (the
largest batch any rank may send, times the EP world size), so shapes never
depend on the batch and the ops can sit inside a captured graph. Tokens past a
rank's real batch are padding, switched off by ``x_active_mask``.

This reference keeps those semantics with two ``all_to_all_single`` calls of
static size per op (gloo on a CPU host, whatever backend the group has
elsewhere): one for the token rows, one for each row's local expert index.
Experts are owned contiguously, as the kernels assume: expert ``e`` lives on
rank ``e // local_experts`` at local index ``e % local_experts``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class MC2Handle:
    """What combine needs to send results back the way dispatch brought tokens.

    ``pairs``: the (token * top_k + j) index of each pair this rank sent, in send
    order; ``send_rows``: the row of the send buffer each of those pairs took;
    ``recv_order``: the received rows in the order ``expand_x`` lists them.
    """

    pairs: torch.Tensor
    send_rows: torch.Tensor
    recv_order: torch.Tensor
    rows_per_rank: int


def _exchange(tensor: torch.Tensor, group: object | None, world_size: int) -> torch.Tensor:
    """Equal-split all-to-all: block ``d`` of the input goes to rank ``d``."""
    if world_size == 1:
        return tensor.clone()
    out = torch.empty_like(tensor)
    dist.all_to_all_single(out, tensor.contiguous(), group=group)
    return out


def _rows_per_rank(global_bs: int, ep_world_size: int, local_experts: int, top_k: int) -> int:
    return (global_bs // ep_world_size) * min(local_experts, top_k)


class ReferenceMC2Ops:
    """MC2 dispatch/combine (mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`)."""

    def moe_distribute_dispatch(self, x: torch.Tensor, expert_ids: torch.Tensor, group: object | None,
                                ep_world_size: int, ep_rank_id: int, moe_expert_num: int, *,
                                global_bs: int, x_active_mask: torch.Tensor | None = None,
                                ) -> tuple[torch.Tensor, torch.Tensor, MC2Handle]:
        """Send each active (token, expert) pair's row to the expert's owner.

        ``x`` [BS, H] and ``expert_ids`` [BS, K] (distinct experts per row) are
        this rank's batch; ``BS`` may not exceed ``global_bs / ep_world_size``
        (the capacity). Returns ``expand_x`` [A, H] with
        ``A = global_bs * min(local_experts, K)``: the rows this rank's experts
        received, grouped by local expert (rows from lower ranks first), then
        zero padding; ``expert_token_nums`` [local_experts] (int64 counts); and a
        handle for :meth:`moe_distribute_combine`.
        """
        if moe_expert_num % ep_world_size:
            raise ValueError(f"MC2 needs moe_expert_num ({moe_expert_num}) divisible by the EP world size "
                             f"({ep_world_size})")
        local_experts = moe_expert_num // ep_world_size
        batch, top_k = expert_ids.shape
        capacity = global_bs // ep_world_size
        if batch > capacity:
            raise ValueError(f"MC2 dispatch of {batch} tokens exceeds its capacity of {capacity} per rank "
                             f"(global_bs {global_bs} over {ep_world_size} ranks)")
        rows = _rows_per_rank(global_bs, ep_world_size, local_experts, top_k)
        hidden = x.shape[-1]

        experts = expert_ids.reshape(-1).long()
        active = torch.ones(batch, dtype=torch.bool, device=x.device) if x_active_mask is None else x_active_mask
        kept = torch.nonzero(active.repeat_interleave(top_k), as_tuple=True)[0]
        pairs = kept[torch.argsort(experts[kept], stable=True)]  # by owner, then local expert, then token
        owners = experts[pairs] // local_experts
        per_owner = torch.bincount(owners, minlength=ep_world_size)
        first_of_owner = torch.cumsum(per_owner, 0) - per_owner
        send_rows = owners * rows + (torch.arange(pairs.numel(), device=x.device) - first_of_owner[owners])

        send_x = x.new_zeros(ep_world_size * rows, hidden)
        send_x[send_rows] = x[pairs // top_k]
        send_expert = torch.full((ep_world_size * rows,), -1, dtype=torch.int64, device=x.device)
        send_expert[send_rows] = experts[pairs] % local_experts

        recv_x = _exchange(send_x, group, ep_world_size)
        recv_expert = _exchange(send_expert, group, ep_world_size)
        valid = torch.nonzero(recv_expert >= 0, as_tuple=True)[0]
        recv_order = valid[torch.argsort(recv_expert[valid], stable=True)]
        expand_x = x.new_zeros(ep_world_size * rows, hidden)
        expand_x[: recv_order.numel()] = recv_x[recv_order]
        expert_token_nums = torch.bincount(recv_expert[valid], minlength=local_experts).to(torch.int64)
        return expand_x, expert_token_nums, MC2Handle(pairs, send_rows, recv_order, rows)

    def moe_distribute_combine(self, expand_x: torch.Tensor, expert_ids: torch.Tensor, handle: MC2Handle,
                               expert_scales: torch.Tensor, group: object | None, ep_world_size: int,
                               ep_rank_id: int, moe_expert_num: int, *, global_bs: int,
                               x_active_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Bring expert outputs back and sum them per token, weighted by ``expert_scales`` [BS, K].

        ``expand_x`` holds the experts' outputs in the row order dispatch
        returned. Inactive (padding) tokens come back as zeros.
        """
        batch, top_k = expert_ids.shape
        hidden = expand_x.shape[-1]
        received = expand_x.new_zeros(ep_world_size * handle.rows_per_rank, hidden)
        received[handle.recv_order] = expand_x[: handle.recv_order.numel()]
        returned = _exchange(received, group, ep_world_size)
        weights = expert_scales.reshape(-1)[handle.pairs].float().unsqueeze(-1)
        out = torch.zeros(batch, hidden, dtype=torch.float32, device=expand_x.device)
        out.index_add_(0, handle.pairs // top_k, returned[handle.send_rows].float() * weights)
        return out.to(expand_x.dtype)

"""Pieces the built-in methods share: the seam ops of the selection context, token-group gathers."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ascend_kernel.ops.moe_parallel import MoEParallel, gather_sizes


def seam_ops(ctx: Any) -> Any:
    from ascend_kernel.ops import ops_for

    return ops_for(ctx)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


def all_gather_batches(tensors: list[torch.Tensor], parallel: MoEParallel) -> tuple[list[torch.Tensor], list[int]]:
    """Every token-group rank's batch, concatenated in rank order (padded to the largest for the collective)."""
    sizes = gather_sizes(tensors[0].shape[0], parallel.token_group, parallel.token_size, tensors[0].device)
    if parallel.token_size == 1:
        return tensors, sizes
    longest = max(sizes)
    gathered = []
    for t in tensors:
        out = t.new_empty(parallel.token_size * longest, *t.shape[1:])
        dist.all_gather_into_tensor(out, pad_rows(t, longest).contiguous(), group=parallel.token_group)
        blocks = out.view(parallel.token_size, longest, *t.shape[1:])
        gathered.append(torch.cat([blocks[r, :n] for r, n in enumerate(sizes)]))
    return gathered, sizes


def broadcast_batches(tensors: list[torch.Tensor], parallel: MoEParallel) -> tuple[list[torch.Tensor], list[int]]:
    """Every token-group rank's batch, each rank's sent to all others by a broadcast of its own."""
    sizes = gather_sizes(tensors[0].shape[0], parallel.token_group, parallel.token_size, tensors[0].device)
    if parallel.token_size == 1:
        return tensors, sizes
    ranks = dist.get_process_group_ranks(parallel.token_group)
    gathered = []
    for t in tensors:
        parts = []
        for r, n in enumerate(sizes):
            part = t.contiguous() if r == parallel.token_rank else t.new_empty(n, *t.shape[1:])
            dist.broadcast(part, src=ranks[r], group=parallel.token_group)
            parts.append(part)
        gathered.append(torch.cat(parts))
    return gathered, sizes


def own_rows(sizes: list[int], parallel: MoEParallel) -> slice:
    start = sum(sizes[: parallel.token_rank])
    return slice(start, start + sizes[parallel.token_rank])

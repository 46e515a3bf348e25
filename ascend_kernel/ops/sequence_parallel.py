"""Sequence parallelism's token collectives over a tensor-parallel process group (the ops seam).

The tokens of a pass are padded to ``padded_tokens`` (a multiple of the TP
size) and split along dim 0 into equal shards, rank ``r`` holding rows
``[r * s, (r + 1) * s)``. ``reduce_scatter_tokens`` sums the ranks' partial
results and leaves each rank its shard (where an all-reduce would leave every
rank every token); ``all_gather_tokens`` puts the shards back together and
drops the padding. Both run on ``torch.distributed`` over the group they are
given: gloo on a CPU host (vLLM-CPU's TP device group), HCCL on an NPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 names them *_single (the *_tensor names warn there); the torch of an NPU host may have only the old ones
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def pad_tokens(x: torch.Tensor, padded_tokens: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``padded_tokens`` rows (``x`` itself when none are needed)."""
    missing = padded_tokens - x.shape[0]
    if missing < 0:
        raise ValueError(f"{x.shape[0]} tokens do not fit in {padded_tokens}")
    if missing == 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])


def token_shard(x: torch.Tensor, padded_tokens: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the full-token tensor ``x`` (padded first), as a tensor of its own."""
    shard = padded_tokens // world_size
    return pad_tokens(x, padded_tokens)[rank * shard:(rank + 1) * shard].clone()


def reduce_scatter_tokens(partial: torch.Tensor, padded_tokens: int, group: dist.ProcessGroup | None,
                          world_size: int) -> torch.Tensor:
    """The sum over ranks of ``partial`` (every token), this rank's shard of it only."""
    full = pad_tokens(partial, padded_tokens).contiguous()
    if world_size == 1:
        return full
    out = full.new_empty((padded_tokens // world_size, *full.shape[1:]))
    _reduce_scatter(out, full, group=group)
    return out


def all_gather_tokens(shard: torch.Tensor, num_tokens: int, group: dist.ProcessGroup | None,
                      world_size: int) -> torch.Tensor:
    """Every rank's shard, in rank order, without the padding: the pass's ``num_tokens`` rows."""
    if world_size == 1:
        return shard[:num_tokens]
    shard = shard.contiguous()
    out = shard.new_empty((shard.shape[0] * world_size, *shard.shape[1:]))
    _all_gather(out, shard, group=group)
    return out[:num_tokens]

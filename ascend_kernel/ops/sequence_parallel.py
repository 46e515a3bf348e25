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

from typing import Any

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
    """Rank ``rank``'s shard of the full-token tensor ``x`` (as if ``x`` were padded first), a tensor of its own.

    Only the shard's rows are copied (and padded where they run past ``x``): the whole tensor is never padded."""
    shard = padded_tokens // world_size
    rows = x[rank * shard:(rank + 1) * shard]
    return pad_tokens(rows, shard) if rows.shape[0] < shard else rows.clone()


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


def ring_bytes(tensor_bytes: int, world_size: int) -> int:
    """What one rank sends for a reduce-scatter (or an all-gather) of ``tensor_bytes`` full-size bytes over a ring.

    An all-reduce is a reduce-scatter and an all-gather: twice this. It is the
    figure both choices are compared by (``tp_comm_bytes_sent``), whatever
    algorithm the backend really runs.
    """
    return (world_size - 1) * tensor_bytes // world_size


def combine_add_rms_norm(add_rms_norm: Any, partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float, sequence_parallel: bool, comm: Any, reduced: bool = False,
                         add_rms_norm_in_place: Any = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Combine the ranks' row-parallel ``partial`` sums, add ``residual`` and RMS-normalise, either way.

    ``comm`` has ``rank_in_group``, ``world_size``, ``all_reduce(x)``,
    ``reduce_scatter(x, dim)`` and ``all_gather(x, dim)`` (vLLM's TP group
    coordinator has them). Shapes are those of an all-reduce pass in both
    choices, so one traced graph serves both: ``partial`` and ``residual``
    hold every token of the pass, and so do the two outputs.

    * all-reduce: sum ``partial`` over the ranks, then add and normalise
      every token;
    * sequence parallel (FlashComm v1): pad to a multiple of the TP size,
      reduce-scatter, add this rank's shard of ``residual`` and normalise the
      shard, all-gather the normed shards. The returned residual holds this
      rank's shard rows; its other rows are left unwritten, since the next norm
      reads only this rank's rows again (each rank's shard of the pass is fixed;
      zeroing them cost this host as much as the shard's norm).
      With ``reduced`` the row-parallel layer already reduce-scattered (a
      fused matmul + reduce-scatter): ``partial`` holds this rank's shard
      rows of the sum, zeros elsewhere, and is read instead of reduced here.

    ``add_rms_norm_in_place(x, residual, weight, eps) -> bool`` (the
    provider's, where it has one) lets a sequence-parallel pass normalise the
    reduce-scattered shard it owns in place, adding into its own output's
    rows, instead of the op's two copies; False falls back to the op.

    Returns ``(normed, residual, bytes this rank sent)``.
    """
    world = comm.world_size
    tokens = partial.shape[0]
    row_bytes = partial[:1].numel() * partial.element_size()
    if not sequence_parallel or world == 1:
        out, added = add_rms_norm(comm.all_reduce(partial), residual, weight, eps)
        return out, added, 2 * ring_bytes(tokens * row_bytes, world)
    padded = -(-tokens // world) * world
    shard = padded // world
    rank = comm.rank_in_group
    lo, hi = rank * shard, min((rank + 1) * shard, tokens)
    rows = max(hi - lo, 0)
    if reduced:  # this rank's rows only, padded to the shard (the rest of ``partial`` is zeros)
        summed = pad_tokens(partial[lo:lo + rows], shard)
    else:
        summed = comm.reduce_scatter(pad_tokens(partial, padded).contiguous(), 0)
    if add_rms_norm_in_place is not None and not reduced and rows == shard:
        residual_out = torch.empty_like(residual)  # only this rank's rows are written; the others are never read
        own = residual_out[lo:hi]
        own.copy_(residual[lo:hi])
        if add_rms_norm_in_place(summed, own, weight, eps):  # summed: the reduce-scatter's fresh shard, ours
            return comm.all_gather(summed, 0)[:tokens], residual_out, 2 * ring_bytes(padded * row_bytes, world)
    # the shard's rows as a view where no padding is needed (the add_rms_norm op does not write its inputs)
    residual_shard = residual[lo:hi] if rows == shard else token_shard(residual, padded, rank, world)
    out, added = add_rms_norm(summed, residual_shard, weight, eps)
    gathered = comm.all_gather(out.contiguous(), 0)[:tokens]
    residual_out = torch.empty_like(residual)  # this rank's rows only (the others are never read)
    residual_out[lo:lo + rows] = added[:rows]
    return gathered, residual_out, 2 * ring_bytes(padded * row_bytes, world)


class GroupComm:
    """``combine_add_rms_norm``'s ``comm`` over a bare ``torch.distributed`` group (tests; vLLM has its own)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank_in_group = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=self.group)
        return x

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0
        out = x.new_empty((x.shape[0] // self.world_size, *x.shape[1:]))
        _reduce_scatter(out, x.contiguous(), group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0
        out = x.new_empty((x.shape[0] * self.world_size, *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=self.group)
        return out

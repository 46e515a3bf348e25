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
        # multiply mode (div_mode=False) along the last axis; scale and offset must share x's dtype there
        return self._npu.npu_quantize(x, inv_scale.to(x.dtype), offset.to(x.dtype), torch.qint8, -1, False)

    @seam_op("dynamic_quant", DYNAMIC_QUANT_SCHEMA, dynamic_quant_fake)
    def dynamic_quant(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = self._npu.npu_dynamic_quant(x)
        return q, scale.to(torch.float32)

    @seam_op("quant_matmul", QUANT_MATMUL_SCHEMA, quant_matmul_fake)
    def quant_matmul(self, x_q: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     pertoken_scale: torch.Tensor | None, bias: torch.Tensor | None,
                     output_dtype: torch.dtype) -> torch.Tensor:
        # float16 output without a per-token scale takes the packed int64 scale (npu_trans_quant_param)
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
        rows = rows.masked_fill((torch.arange(num_rows, device=rows.device) >= ends[-1]).unsqueeze(1), 0)
        ends = torch.cat([ends[:-1], ends.new_full((1,), num_rows)])
        if weight_scale.dtype != torch.int64:  # int4 experts come with their scales packed (int4_experts)
            weight_scale = weight_scale.to(torch.float32)
        return self._npu.npu_grouped_matmul([rows], [weight], scale=[weight_scale],
                                            bias=None if bias is None else [bias.to(torch.float32)],
                                            per_token_scale=[row_scale.to(torch.float32)], group_list=ends,
                                            split_item=2, group_type=0, group_list_type=0,
                                            output_dtype=output_dtype)[0]

    def int4_experts(self, values: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """int4 expert weights [E, K, N] in the device's form: packed int4, int64 scales, and the kernel's bias.

        The int4 grouped matmul takes the weight packed eight values to an
        int32 (``npu_convert_weight_to_int4pack``), per-channel scales as
        float32 bits in int64 (``npu_trans_quant_param``), and a bias of
        ``8 * sum_k(w * scale)`` per output channel that its int4 arithmetic
        needs (the correction msModelSlim writes as ``scale_bias``).
        """
        packed = torch.stack([self._npu.npu_convert_weight_to_int4pack(w.to(torch.int32)) for w in values])
        scale32 = scale.to(torch.float32)
        packed_scale = torch.stack([self._npu.npu_trans_quant_param(s, None) for s in scale32])
        bias = 8 * (values.to(torch.float32) * scale32.unsqueeze(1)).sum(dim=1)
        return packed, packed_scale, bias

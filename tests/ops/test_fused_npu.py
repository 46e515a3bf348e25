"""The torch_npu provider's norm / rotary / fused ops adapt the seam's contracts to torch_npu's documented calls.

No NPU here: ``torch_npu`` is stood in for by functions doing what its
documentation says each op returns (tuple order, division-mode quantization,
in-place rotary), computed in plain torch. Under test is the provider's
adaptation (the reciprocal scale the fused kernel divides by, which outputs it
keeps, copies before an in-place kernel), checked against the reference provider.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ascend_kernel.ops import get_ops
from ascend_kernel.ops.fused_reference import rms_norm_math
from ascend_kernel.ops.npu import TorchNpuOps

ref = get_ops("reference", "cpu")


def _norm(x, gamma, eps):
    return rms_norm_math(x, gamma, eps)


def _add_rms_norm(x1, x2, gamma, epsilon):
    summed = x1 + x2
    y, rstd = _norm(summed, gamma, epsilon)
    return y, rstd, summed


def _add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, axis=-1,
                        epsilon=1e-6, div_mode=True):
    assert div_mode and scales1.dtype == x1.dtype, "the kernel divides by a scale in the input's dtype"
    y, _, summed = _add_rms_norm(x1, x2, gamma, epsilon)
    y = y if beta is None else y + beta
    q = torch.round(y.float() / scales1.float() + zero_points1.float()).clamp(-128, 127).to(torch.int8)
    return q, None, summed


def _add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=None, smooth_scale2=None, beta=None, epsilon=1e-6,
                                output_mask=None):
    assert output_mask == [True, False]
    y, _, summed = _add_rms_norm(x1, x2, gamma, epsilon)
    y = y if beta is None else y + beta
    q, scale = ref.dynamic_quant(y)
    return q, None, summed, scale, None


def _rotary(positions, query, key, head_size, cos_sin_cache, is_neox_style):
    ref.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)


def _provider() -> TorchNpuOps:
    ops = object.__new__(TorchNpuOps)
    ops._npu = SimpleNamespace(npu_rms_norm=_norm, npu_add_rms_norm=_add_rms_norm,
                               npu_add_rms_norm_quant=_add_rms_norm_quant,
                               npu_add_rms_norm_dynamic_quant=_add_rms_norm_dynamic_quant,
                               _npu_rotary_embedding=_rotary)
    return ops


def _inputs():
    gen = torch.Generator().manual_seed(11)
    return (torch.randn(5, 32, generator=gen), torch.randn(5, 32, generator=gen), torch.randn(32, generator=gen),
            torch.randn(32, generator=gen))


def test_add_rms_norm_quant_passes_the_divisor_and_keeps_the_sum():
    x, r, w, bias = _inputs()
    inv_scale, offset = torch.full((32,), 16.0), torch.full((32,), 2.0)  # powers of two: division is exact
    for beta in (None, bias):
        q, summed = _provider().add_rms_norm_quant(x, r, w, 1e-6, inv_scale, offset, beta)
        q_ref, summed_ref = ref.add_rms_norm_quant(x, r, w, 1e-6, inv_scale, offset, beta)
        assert torch.equal(q, q_ref) and torch.equal(summed, summed_ref)


def test_add_rms_norm_dynamic_quant_keeps_the_first_quantized_output():
    x, r, w, bias = _inputs()
    for beta in (None, bias):
        got, want = _provider().add_rms_norm_dynamic_quant(x, r, w, 1e-5, beta), \
            ref.add_rms_norm_dynamic_quant(x, r, w, 1e-5, beta)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_qk_norm_rope_and_rope_leave_their_inputs():
    gen = torch.Generator().manual_seed(2)
    head = 16
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    cache = torch.cat([(torch.arange(8).float()[:, None] * inv).cos(), (torch.arange(8).float()[:, None] * inv).sin()],
                      -1)
    q, k = torch.randn(3, 4 * head, generator=gen), torch.randn(3, 2 * head, generator=gen)
    qw, kw, positions = torch.randn(head, generator=gen), torch.randn(head, generator=gen), torch.tensor([1, 4, 7])
    q0, k0 = q.clone(), k.clone()
    npu = _provider()
    for got, want in ((npu.qk_norm_rope(positions, q, k, qw, kw, 1e-6, head, cache, True),
                       ref.qk_norm_rope(positions, q, k, qw, kw, 1e-6, head, cache, True)),
                      (npu.rope(positions, q, k, head, cache, False), ref.rope(positions, q, k, head, cache, False))):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert torch.equal(npu.muls_add(q, q0, 0.5), q * 0.5 + q0)  # powers of two: one rounding or two agree

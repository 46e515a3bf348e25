"""The seam's int8 quantization ops (reference provider) against float64 evaluations written here with numpy,
and the two int8 linear executors (the seam's ops, vLLM-CPU's int8 GEMMs) against the same formulas.

The NPU formulas (torch_npu's documentation): ``npu_quantize`` (multiply mode)
``round(x * scale + offset)``; ``npu_dynamic_quant`` per row ``scale = max|x| / 127``,
``round(x / scale)``; ``npu_quant_matmul`` ``(x1 @ x2 + int32 bias) * scale [* pertoken]``
or ``x1 @ x2 * scale [* pertoken] + float bias``. Rounding is half to even
(numpy's ``rint``), clamped to int8.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_kernel.ops import get_ops
from ascend_kernel.ops.quant_ops import PACKED_SCALE_MASK, float32_bits_to_scale, unpack_int4_rows, unpack_scale

ops = get_ops("reference", "cpu")


def np_quantize(x: np.ndarray, inv_scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x.astype(np.float64) * inv_scale + offset), -128, 127).astype(np.int64)


def np_quant_matmul(xq: np.ndarray, w: np.ndarray, scale: np.ndarray, pertoken: np.ndarray | None,
                    bias: np.ndarray | None, int_bias: bool) -> np.ndarray:
    acc = xq.astype(np.int64) @ w.astype(np.int64)  # exact integers
    out = acc.astype(np.float64)
    if bias is not None and int_bias:
        out = (acc + bias.astype(np.int64)).astype(np.float64)
    out = out * scale.astype(np.float64)
    if pertoken is not None:
        out = out * pertoken.astype(np.float64)[:, None]
    if bias is not None and not int_bias:
        out = out + bias.astype(np.float64)
    return out


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 40), per_channel=st.booleans(), seed=st.integers(0, 2**16))
def test_quantize_is_the_npu_formula(rows, cols, per_channel, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 4
    n = cols if per_channel else 1
    inv = torch.rand(n, generator=g) * 40 + 0.5
    offset = torch.randint(-20, 20, (n,), generator=g).float()
    got = ops.quantize(x, inv, offset)
    assert got.dtype == torch.int8
    want = np_quantize(x.numpy(), inv.numpy().astype(np.float64), offset.numpy())
    # float32 vs float64 products may straddle a .5 boundary: at most one unit off, and rarely
    diff = np.abs(got.numpy().astype(np.int64) - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02


def test_quantize_saturates_and_rounds_half_to_even():
    x = torch.tensor([[1000.0, -1000.0, 0.5, 1.5, 2.5, -0.5]])
    got = ops.quantize(x, torch.ones(1), torch.zeros(1))
    assert got.tolist() == [[127, -128, 0, 2, 2, 0]]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 8), cols=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_dynamic_quant_is_per_row_symmetric(rows, cols, seed):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3
    q, scale = ops.dynamic_quant(x)
    xs = x.numpy().astype(np.float64)
    want_scale = np.abs(xs).max(axis=1) / 127
    np.testing.assert_allclose(scale.numpy(), want_scale, rtol=1e-6)
    want_q = np.clip(np.rint(xs / want_scale[:, None]), -128, 127)
    diff = np.abs(q.numpy().astype(np.int64) - want_q)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02
    # each row's largest magnitude lands on +-127
    assert (q.abs().amax(dim=1) == 127).all()


def test_dynamic_quant_zero_row_gives_zeros():
    q, scale = ops.dynamic_quant(torch.zeros(2, 8))
    assert q.abs().sum() == 0 and scale.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("case", ["int-bias", "float-bias-pertoken", "no-bias-pertoken", "packed-scale"])
def test_quant_matmul_is_the_npu_formula(case):
    g = torch.Generator().manual_seed(7)
    m, k, n = 5, 48, 24
    xq = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 1e-3 + 1e-5
    pertoken = torch.rand(m, generator=g) * 0.1 if "pertoken" in case else None
    if case == "int-bias":
        bias = torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int32)
    elif case == "float-bias-pertoken":
        bias = torch.randn(n, generator=g)
    else:
        bias = None
    given_scale = scale
    if case == "packed-scale":  # npu_trans_quant_param's form: float32 bits in an int64; the device keeps 19 bits
        given_scale = scale.view(torch.int32).to(torch.int64)
        scale = (scale.view(torch.int32) & PACKED_SCALE_MASK).view(torch.float32)
    got = ops.quant_matmul(xq, w, given_scale, pertoken, bias, torch.float32)
    want = np_quant_matmul(xq.numpy(), w.numpy(), scale.numpy(), None if pertoken is None else pertoken.numpy(),
                           None if bias is None else bias.numpy(), case == "int-bias")
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-6, atol=1e-6)
    assert ops.quant_matmul(xq, w, given_scale, pertoken, bias, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_quant_matmul_groups_rows_and_zeroes_the_rest(with_bias):
    g = torch.Generator().manual_seed(3)
    experts, k, n, rows = 3, 16, 8, 9
    xq = torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (experts, k, n), generator=g, dtype=torch.int8)
    w_scale = torch.rand(experts, n, generator=g) * 1e-2
    bias = torch.randn(experts, n, generator=g) if with_bias else None
    row_scale = torch.rand(rows, generator=g)
    counts = torch.tensor([3, 0, 4])  # rows 7 and 8 are past the groups
    got = ops.grouped_quant_matmul(xq, w, w_scale, row_scale, counts, bias, torch.float32).numpy()
    start = 0
    for e, c in enumerate(counts.tolist()):
        for r in range(start, start + c):
            acc = (xq[r].numpy().astype(np.int64) @ w[e].numpy().astype(np.int64)) * w_scale[e].numpy().astype(np.float64)
            if bias is not None:
                acc = acc + bias[e].numpy().astype(np.float64)
            np.testing.assert_allclose(got[r], acc * float(row_scale[r]), rtol=2e-6, atol=1e-6)
        start += c
    assert not got[7:].any()


def test_int4_rows_unpack_what_msmodelslim_packs():
    """msModelSlim's own W4A8 packer (its ascendv1 saver's) is the oracle of the byte layout."""
    from tests.msmodelslim_pack import load

    pack = load()
    if pack is None:
        pytest.skip("msmodelslim is not installed")
    g = torch.Generator().manual_seed(4)
    values = torch.randint(-8, 8, (3, 10, 6), generator=g, dtype=torch.int8)  # [experts, N, K]
    packed = torch.stack([pack.w4a8_pack_int4(v) for v in values])
    assert packed.shape == (3, 5, 6) and packed.dtype == torch.int8
    assert torch.equal(unpack_int4_rows(packed), values)
    assert torch.equal(unpack_int4_rows(pack.w4a8_pack_int4(values[0])), values[0])


def test_int4_experts_compute_the_int4_formula():
    """The reference's int4 experts: ``(x_q @ w4) * w_scale * row_scale`` with int4 values, exactly as float64 does."""
    g = torch.Generator().manual_seed(5)
    values = torch.randint(-8, 8, (2, 12, 4), generator=g, dtype=torch.int8)  # [E, K, N]
    scale = torch.rand(2, 4, generator=g) * 0.1
    rows = values.transpose(1, 2)  # [E, N, K]: msModelSlim packs output rows 2j (low nibble) and 2j + 1 (high)
    packed = ((rows[:, 0::2] & 0xF) | (rows[:, 1::2] << 4)).to(torch.int8)
    weight, w_scale, bias = ops.int4_experts(packed, scale, None)
    xq = torch.randint(-128, 128, (5, 12), generator=g, dtype=torch.int8)
    row_scale = torch.rand(5, generator=g)
    got = ops.grouped_quant_matmul(xq, weight, w_scale, row_scale, torch.tensor([2, 3]), bias, torch.float32)
    x, w = xq.numpy().astype(np.float64), values.numpy().astype(np.float64)
    want = np.concatenate([x[:2] @ w[0] * scale[0].numpy(), x[2:] @ w[1] * scale[1].numpy()])
    np.testing.assert_allclose(got.numpy(), want * row_scale.numpy()[:, None].astype(np.float64), rtol=2e-6)


def test_packed_and_stored_scales_decode():
    values = torch.tensor([0.0123, 3.5e-4], dtype=torch.float32)
    bits = values.view(torch.int32).to(torch.int64)  # msModelSlim's deq_scale for float32 sources
    assert torch.equal(float32_bits_to_scale(bits), values)
    assert torch.equal(float32_bits_to_scale(values), values)
    assert torch.equal(unpack_scale(values), values)
    kept = unpack_scale(bits)
    assert torch.allclose(kept, values, rtol=2 ** -10) and not torch.equal(kept, values)


# -- the int8 linear executors -------------------------------------------------------


def _layer(static: bool, seed: int = 0, n: int = 64, k: int = 128):
    from ascend_kernel_plugins.quantization.int8_linear import Int8Weights

    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    weight_scale = torch.rand(n, generator=g) * 2e-3 + 1e-4
    if not static:
        return Int8Weights(weight, weight_scale, None, None)
    input_scale, offset = torch.tensor([0.03]), torch.tensor([-5.0])
    deq = input_scale * weight_scale
    codes = torch.randint(-300, 300, (n,), generator=g, dtype=torch.int64)  # a folded bias, in deq units
    return Int8Weights(weight, weight_scale, input_scale, offset, deq_scale=deq, bias_codes=codes)


def _formula(w, x: torch.Tensor) -> np.ndarray:
    """The NPU computation of the layer, float64, from the checkpoint's quantities."""
    xs = x.double().numpy()
    wt = w.weight.numpy().astype(np.int64).T
    if w.input_scale is None:
        scale = np.abs(xs).max(axis=1) / 127
        xq = np.clip(np.rint(xs / scale[:, None]), -128, 127).astype(np.int64)
        return (xq @ wt) * w.weight_scale.double().numpy() * scale[:, None]
    zp = float(w.zero_point)
    xq = np_quantize(xs, 1 / w.input_scale.double().numpy(), np.float64(zp))
    int_bias = w.bias_codes.numpy() - zp * w.weight.numpy().astype(np.int64).sum(axis=1)
    return (xq @ wt + int_bias) * w.deq_scale.double().numpy()


@pytest.mark.parametrize("static", [False, True], ids=["W8A8_DYNAMIC", "W8A8"])
def test_seam_executor_computes_the_npu_layer(static):
    from ascend_kernel_plugins.quantization.int8_linear import SeamInt8Executor

    w = _layer(static)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(1))
    got = SeamInt8Executor(w, ops)(x, None).double().numpy()
    want = _formula(w, x)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


@pytest.mark.parametrize("static", [False, True], ids=["W8A8_DYNAMIC", "W8A8"])
def test_vllm_cpu_int8_executor_agrees_with_the_npu_layer(static):
    """vLLM-CPU's kernels, given the converted scales, zero point and folded bias, compute the same layer."""
    from ascend_kernel.ops import quant_cpu
    from ascend_kernel_plugins.quantization.int8_linear import CpuInt8Executor

    if quant_cpu.unserved_reason(torch.bfloat16) is not None:
        pytest.skip(quant_cpu.unserved_reason(torch.bfloat16))
    if not _has_int8_dot_product():
        # measured on an AVX2-only AMD EPYC: the dynamic layer off by 13% of the output's scale, in stock vLLM-CPU's
        # kernel too (oneDNN's u8*s8 pair sums saturate 16 bits without VNNI); docs/quantization.md
        pytest.skip("this CPU has no VNNI/AMX int8 dot product: vLLM-CPU's oneDNN int8 GEMM is not exact here")
    w = _layer(static)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    executor = CpuInt8Executor(w, torch.bfloat16, None, bias_folded=static)
    got = executor(x, None).double().numpy()
    want = _formula(w, x.float())
    # bfloat16 output and activation rounding: a few parts in a thousand of the output's scale
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    assert executor.weight_bytes() <= 0.27 * 4 * w.weight.numel()  # int8 in memory, scales included


def _has_int8_dot_product() -> bool:
    """Whether this x86 CPU has an int8 dot-product instruction (AVX512-VNNI, AVX-VNNI or AMX)."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return True
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}) or "avx2" not in flags

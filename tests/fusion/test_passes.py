"""Each fusion pass on small traced graphs: how many patterns it matched, and the same outputs as the unfused graph.

The graphs are traced with ``make_fx`` (aten ops and the seam's registered
ops, as a post-grad graph holds them), rewritten by the pass, recompiled,
and run on the same inputs as an untouched copy: outputs must be equal
(the fused ops are the composition of what they replace).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ascend_kernel.ops import get_ops
from ascend_kernel_plugins.fusion.passes import MulsAddPass, NormQuantPass, QkNormRopePass

ops = get_ops("reference", "cpu")


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _run_pass(fn, fusion_pass, *inputs):
    """(matches, fused graph module, outputs fused, outputs unfused)."""
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    unfused = copy.deepcopy(gm)
    found = fusion_pass(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return found, gm, gm(*inputs), unfused(*inputs)


def _assert_same(a, b):
    for x, y in zip(a if isinstance(a, (tuple, list)) else [a], b if isinstance(b, (tuple, list)) else [b]):
        assert torch.equal(x, y)


def _layers(n, quant, with_bias=False):
    """``n`` decoder-ish blocks: add + norm [+ bias], quantize the normed rows, a stand-in matmul, next residual."""
    def fn(x, residual, weight, inv_scale, offset, bias):
        outs = []
        for _ in range(n):
            normed, residual = ops.add_rms_norm(x, residual, weight, 1e-6)
            if with_bias:
                normed = normed + bias
            if quant == "static":
                q = ops.quantize(normed, inv_scale, offset)
                outs.append(q)
                x = q.float() * 0.01
            else:
                q, scale = ops.dynamic_quant(normed)
                outs.append(q)
                outs.append(scale)
                x = q.float() * scale[:, None]
        return (*outs, residual)
    return fn


def _norm_inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(7)
    return (torch.randn(4, 32, generator=gen).to(dtype), torch.randn(4, 32, generator=gen).to(dtype),
            torch.randn(32, generator=gen).to(dtype), torch.full((1,), 30.0), torch.zeros(1),
            torch.linspace(-1, 1, 32).to(dtype))


@pytest.mark.parametrize("quant", ["static", "dynamic"])
@pytest.mark.parametrize("layers", [1, 3])
def test_norm_quant_matches_each_layer_and_keeps_outputs(quant, layers):
    fusion = NormQuantPass()
    found, gm, fused, unfused = _run_pass(_layers(layers, quant), fusion, *_norm_inputs())
    assert found == layers == fusion.matches
    fused_op = "ascend_kernel.add_rms_norm_quant.default" if quant == "static" else \
        "ascend_kernel.add_rms_norm_dynamic_quant.default"
    assert _targets(gm).count(fused_op) == layers
    assert "ascend_kernel.add_rms_norm.default" not in _targets(gm)
    _assert_same(fused, unfused)


def test_norm_quant_with_bias():
    found, gm, fused, unfused = _run_pass(_layers(2, "static", True), NormQuantPass(), *_norm_inputs())
    assert found == 2
    _assert_same(fused, unfused)


def test_norm_quant_leaves_a_norm_whose_output_is_used_twice():
    def fn(x, residual, weight, inv_scale, offset, bias):
        normed, summed = ops.add_rms_norm(x, residual, weight, 1e-6)
        return ops.quantize(normed, inv_scale, offset), normed * 2, summed

    found, gm, fused, unfused = _run_pass(fn, NormQuantPass(), *_norm_inputs())
    assert found == 0 and "ascend_kernel.add_rms_norm.default" in _targets(gm)


def test_norm_quant_on_npu_refuses_float32_and_says_why():
    fusion = NormQuantPass(device_kind="npu")
    found, _, _, _ = _run_pass(_layers(2, "static"), fusion, *_norm_inputs())
    assert found == 0
    assert any("float16/bfloat16" in why for why in fusion.skipped), fusion.skipped
    assert fusion.describe()["skipped"]


def _attention_like(heads, kv_heads, head, eps_k=1e-6, layers=1):
    q_size, kv_size = heads * head, kv_heads * head

    def fn(qkv, positions, q_weight, k_weight, cache):
        outs = []
        for _ in range(layers):
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = ops.rms_norm(q.view(*q.shape[:-1], heads, head), q_weight, 1e-6)[0].view(q.shape)
            k = ops.rms_norm(k.view(*k.shape[:-1], kv_heads, head), k_weight, eps_k)[0].view(k.shape)
            q, k = ops.rope(positions, q, k, head, cache, True)
            outs += [q, k, v]
            qkv = torch.cat([q, k, v], dim=-1)
        return tuple(outs)
    return fn, q_size + 2 * kv_size


def _rope_inputs(width, head, tokens=5):
    gen = torch.Generator().manual_seed(3)
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    angles = torch.arange(64).float()[:, None] * inv[None]
    return (torch.randn(tokens, width, generator=gen), torch.randint(0, 64, (tokens,), generator=gen),
            torch.randn(head, generator=gen), torch.randn(head, generator=gen),
            torch.cat([angles.cos(), angles.sin()], -1))


@pytest.mark.parametrize("layers", [1, 2])
def test_qknorm_rope_matches_and_keeps_outputs(layers):
    fn, width = _attention_like(4, 2, 16, layers=layers)
    fusion = QkNormRopePass()
    found, gm, fused, unfused = _run_pass(fn, fusion, *_rope_inputs(width, 16))
    assert found == layers
    targets = _targets(gm)
    assert targets.count("ascend_kernel.qk_norm_rope.default") == layers
    assert "ascend_kernel.rope.default" not in targets and "ascend_kernel.rms_norm.default" not in targets
    _assert_same(fused, unfused)


def test_qknorm_rope_with_different_eps_is_skipped_with_the_reason():
    fn, width = _attention_like(2, 1, 8, eps_k=1e-5)
    fusion = QkNormRopePass()
    found, _, _, _ = _run_pass(fn, fusion, *_rope_inputs(width, 8))
    assert found == 0 and any("eps" in why for why in fusion.skipped)


def test_muls_add_matches_the_routed_scale_only():
    def fn(routed, shared, other):
        return routed * 2.5 + shared, other * 3.0 + shared

    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(3, 8, generator=gen) for _ in range(3)]
    fusion = MulsAddPass(scale=2.5, provider="reference")
    found, gm, fused, unfused = _run_pass(fn, fusion, *inputs)
    assert found == 1 and _targets(gm).count("ascend_kernel.muls_add.default") == 1
    _assert_same(fused, unfused)
    assert MulsAddPass(scale=None)(make_fx(fn)(*inputs).graph) == 0

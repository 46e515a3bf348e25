"""The seam-backed RMSNorm and rotary layers vs vLLM's own PyTorch implementations of the same layers.

vLLM's ``forward_native`` is the oracle (it is what vLLM runs where it has no
kernel). The replacements are registered in vLLM's out-of-tree op registry
only for the duration of each test.
"""

from __future__ import annotations

import pytest
import torch

ATOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture
def seam_layers():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.custom_op import op_registry_oot

    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel_plugins.layers import seam_layers

    saved_registry, saved_kernel = dict(op_registry_oot), kernel_mod._current
    config = VllmConfig()
    kernel_mod._current = kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu")
    try:
        with set_current_vllm_config(config):
            assert seam_layers.register() == ["RMSNorm", "RotaryEmbedding"]
            assert seam_layers.register() == ["RMSNorm", "RotaryEmbedding"]  # idempotent
            yield seam_layers
    finally:
        op_registry_oot.clear()
        op_registry_oot.update(saved_registry)
        kernel_mod._current = saved_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_vllm_native(seam_layers, dtype, with_residual):
    from vllm.model_executor.layers.layernorm import RMSNorm

    gen = torch.Generator().manual_seed(0)
    layer = RMSNorm(96, eps=1e-5, dtype=dtype)
    assert type(layer) is seam_layers.AscendRMSNorm
    with torch.no_grad():
        layer.weight.copy_(torch.randn(96, generator=gen))
    x = torch.randn(7, 96, generator=gen).to(dtype)
    residual = torch.randn(7, 96, generator=gen).to(dtype) if with_residual else None
    ours = layer.forward_cpu(x.clone(), None if residual is None else residual.clone())
    expected = layer.forward_native(x.clone(), None if residual is None else residual.clone())
    if with_residual:
        torch.testing.assert_close(ours[0], expected[0], atol=ATOL[dtype], rtol=ATOL[dtype])
        torch.testing.assert_close(ours[1], expected[1], atol=ATOL[dtype], rtol=ATOL[dtype])
    else:
        torch.testing.assert_close(ours, expected, atol=ATOL[dtype], rtol=ATOL[dtype])


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_matches_vllm_native(seam_layers, neox, rotary_dim):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    layer = RotaryEmbedding(64, rotary_dim, 256, 10000.0, neox, torch.float32)
    assert type(layer) is seam_layers.AscendRotaryEmbedding
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 256, (9,), generator=gen)
    q, k = torch.randn(9, 4 * 64, generator=gen), torch.randn(9, 2 * 64, generator=gen)
    ours_q, ours_k = layer.forward_cpu(positions, q.clone(), k.clone())
    exp_q, exp_k = layer.forward_native(positions, q.clone(), k.clone())
    torch.testing.assert_close(ours_q, exp_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_k, exp_k, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours_q, q)  # it did rotate
    # no key (cross-layer KV sharing): the query alone, through vLLM's path
    only_q, no_k = layer.forward_cpu(positions, q.clone(), None)
    assert no_k is None and torch.allclose(only_q, exp_q, atol=1e-5)


def test_a_foreign_registration_is_refused_by_name(seam_layers):
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.layernorm import RMSNorm

    class OtherNorm(RMSNorm):
        pass

    op_registry_oot["RMSNorm"] = OtherNorm
    with pytest.raises(RuntimeError, match="'RMSNorm' is already registered as .*OtherNorm.*ASCEND_KERNEL_LAYER_OPS"):
        seam_layers.register()


def test_layer_ops_choice_follows_the_device():
    from vllm.config import VllmConfig

    from ascend_kernel.device import DeviceInfo
    from ascend_kernel.kernel import GLOBAL_FAMILIES, SelectionContext, build_kernel
    from ascend_kernel.registry import choose
    from ascend_kernel.settings import load_settings

    family = next(f for f in GLOBAL_FAMILIES if f.name == "layer_ops")
    kernel = build_kernel(load_settings({}), "cpu")
    entries = kernel.entries(family)
    for device, forced, expected in (("cpu", None, "vllm-native"), ("npu", None, "ascend"), ("cpu", "ascend", "ascend")):
        ctx = SelectionContext(VllmConfig(), kernel.settings, DeviceInfo(device, "A2"))
        impl, record = choose("layer_ops", entries, ctx, forced=forced, forcing_setting="ASCEND_KERNEL_LAYER_OPS")
        assert impl.name == expected, (device, forced, record)
        if device == "npu":
            reasons = {c.name: c.reason for c in record.candidates}
            assert "on an NPU" in reasons["vllm-native"]

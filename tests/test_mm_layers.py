"""The seam-backed ``MRotaryEmbedding`` and ``MMEncoderAttention`` layers vs vLLM's own, the decision record
and the ``--mm-encoder-attn-backend`` reset.

vLLM's ``forward_native`` of each layer is the oracle. The replacements are registered in vLLM's
out-of-tree op registry only for the duration of each test.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture
def mm_layers():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.custom_op import op_registry_oot

    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel_plugins.layers import mm_layers

    saved_registry, saved_kernel = dict(op_registry_oot), kernel_mod._current
    kernel_mod._current = kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu")
    try:
        with set_current_vllm_config(VllmConfig()):
            assert mm_layers.register() == ["MMEncoderAttention", "MRotaryEmbedding"]
            yield mm_layers
    finally:
        op_registry_oot.clear()
        op_registry_oot.update(saved_registry)
        kernel_mod._current = saved_kernel


@pytest.mark.parametrize("four_d", [False, True])
def test_encoder_attention_layer_matches_vllm_native(mm_layers, four_d: bool) -> None:
    from vllm.model_executor.layers.attention import MMEncoderAttention

    layer = MMEncoderAttention(num_heads=2, head_size=80, scale=80 ** -0.5)
    assert type(layer) is mm_layers.AscendMMEncoderAttention
    gen = torch.Generator().manual_seed(0)
    shape = (1, 24, 2, 80) if four_d else (1, 24, 160)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    before = mm_layers.built_counts().get("encoder_passes", 0)
    ours = layer.forward_cpu(q, k, v, cu_seqlens=cu)
    expected = layer.forward_native(q, k, v, cu_seqlens=cu)
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert mm_layers.built_counts()["encoder_passes"] == before + 1
    batch = torch.randn((3, 5, 160), generator=gen)  # no cu_seqlens: each row its own sequence
    torch.testing.assert_close(layer.forward_cpu(batch, batch, batch), layer.forward_native(batch, batch, batch),
                               atol=1e-5, rtol=1e-5)


def test_mrope_layer_matches_vllm_native(mm_layers) -> None:
    from vllm.model_executor.layers.rotary_embedding import get_rope

    layer = get_rope(64, 128, True, {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
                     torch.float32)
    assert type(layer) is mm_layers.AscendMRotaryEmbedding
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 200, (3, 9), generator=gen)
    q, k = torch.randn(9, 128, generator=gen), torch.randn(9, 64, generator=gen)
    for a, b in zip(layer.forward_cpu(positions, q.clone(), k.clone()),
                    layer.forward_native(positions, q.clone(), k.clone())):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _config(backend: object, multimodal: bool = True) -> SimpleNamespace:
    mm = SimpleNamespace(mm_encoder_attn_backend=backend) if multimodal else None
    return SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm, is_multimodal_model=multimodal))


def test_mm_encoder_attn_backend_is_reset_only_where_the_layer_is_replaced() -> None:
    from ascend_kernel.settings import load_settings
    from ascend_kernel_plugins.layers.encoder_attention import BACKEND_PATH, reset_backend

    config = _config("FLASH_ATTN")
    assert reset_backend(load_settings({}), config, "cpu") == []  # vLLM's layer runs: its backend stays
    assert config.model_config.multimodal_config.mm_encoder_attn_backend == "FLASH_ATTN"
    [made] = reset_backend(load_settings({"ascend_kernel": {"layer_ops": "ascend"}}), config, "cpu")
    assert (made.path, made.old, made.new) == (BACKEND_PATH, "FLASH_ATTN", None)
    assert config.model_config.multimodal_config.mm_encoder_attn_backend is None
    assert reset_backend(load_settings({}), _config("TORCH_SDPA"), "npu")[0].new is None
    assert reset_backend(load_settings({}), _config(None), "npu") == []
    assert reset_backend(load_settings({}), _config(None, multimodal=False), "npu") == []


@pytest.mark.parametrize("layer_ops", ["ascend", "vllm-native"])
def test_encoder_attention_decision_is_recorded_for_multimodal_models(layer_ops: str) -> None:
    from vllm.config import set_current_vllm_config

    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel_plugins.layers.encoder_attention import FAMILY, record

    kernel = kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu")
    with set_current_vllm_config(_config(None, multimodal=False)):  # a text model: no such decision
        record(kernel, layer_ops)
    assert not [r for r in kernel.records if r.family == FAMILY]
    with set_current_vllm_config(_config(None)):
        record(kernel, layer_ops)
        record(kernel, layer_ops)  # once per process
    [decision] = [r for r in kernel.records if r.family == FAMILY]
    assert decision.chosen == layer_ops and "layer_ops" in decision.forced_by
    assert {c.name: c.chosen for c in decision.candidates} == {"ascend": layer_ops == "ascend",
                                                                "vllm-native": layer_ops != "ascend"}

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


def _request(request_id: str, hashes: list[str], embeds: int = 4) -> SimpleNamespace:
    """What vLLM's EncoderCacheManager reads of a request: its id, its items' hashes and embedding counts."""
    return SimpleNamespace(request_id=request_id, mm_features=[SimpleNamespace(identifier=h) for h in hashes],
                           get_num_encoder_embeds=lambda i: embeds)


def test_counting_encoder_cache_manager_answers_as_vllms_and_counts_runs_and_hits() -> None:
    """vLLM's own manager, fed the same calls, is the oracle for every answer; the counts are the kernel's."""
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    from ascend_kernel.step import StepTrace
    from ascend_kernel_plugins.layers.encoder_cache import CountingEncoderCacheManager

    ours, theirs = CountingEncoderCacheManager.create_manager(cache_size=64, vllm_config=None), EncoderCacheManager(64)
    one, two = _request("r1", ["a", "a"]), _request("r2", ["a", "b"])

    def both(method: str, request: SimpleNamespace, item: int) -> object:
        answer = getattr(ours, method)(request, item)
        assert answer == getattr(theirs, method)(request, item)
        return answer

    assert both("check_and_update_cache", one, 0) is False
    both("allocate", one, 0)  # r1 encodes a
    assert both("check_and_update_cache", one, 0) is True  # r1's next chunk of its own image: no hit
    assert both("check_and_update_cache", one, 1) is True  # the same image again in r1: served from the cache
    assert both("check_and_update_cache", two, 0) is True  # r2 reuses r1's a
    assert both("check_and_update_cache", two, 1) is False
    both("allocate", two, 1)
    trace = StepTrace()
    ours.get_manager_metadata().count_into(trace)
    assert trace.as_dict()["encoder"] == {"encoder_runs": 2, "encoder_cache_hits": 2}
    assert theirs.get_manager_metadata() is None  # vLLM's sends nothing: the runner skips the step's counts


def test_the_counting_manager_is_named_for_multimodal_decoder_models_only() -> None:
    from ascend_kernel_plugins.layers.encoder_cache import install

    def config(multimodal: bool, encoder_decoder: bool = False, named: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(model_config=SimpleNamespace(is_multimodal_model=multimodal,
                                                            is_encoder_decoder=encoder_decoder),
                               ec_manager_config=SimpleNamespace(encoder_cache_manager_cls=named))

    vlm = config(True)
    [made] = install(vlm)
    assert made.path == "ec_manager_config.encoder_cache_manager_cls" and made.old is None
    assert vlm.ec_manager_config.encoder_cache_manager_cls.endswith("encoder_cache.CountingEncoderCacheManager")
    assert install(vlm) == []  # already named
    for other in (config(False), config(True, encoder_decoder=True), config(True, named="my.Manager")):
        assert install(other) == [] and other.ec_manager_config.encoder_cache_manager_cls in (None, "my.Manager")


def test_the_text_report_says_the_encoder_counts() -> None:
    from ascend_kernel.cli.render import report_text

    trace = {"steps": 3, "attention_states": {}, "moe_methods": {}, "sampler_calls": 3, "rejection_sampler_calls": 0,
             "drafter_calls": 0}
    report = {"device": "cpu", "decisions": [], "trace": {**trace, "encoder": {"encoder_runs": 2,
                                                                                 "encoder_cache_hits": 1}}}
    assert "vision encoder: 2 runs, 1 encoder-cache hits" in report_text(report)
    assert "vision encoder" not in report_text({**report, "trace": trace})

"""Graph-mode rules and NPU config fix-ups, applied to real vLLM configs.

The NPU itself is absent here, but these decisions are pure config logic:
they run on vLLM's own ``VllmConfig`` objects with a device description that
says "npu", exactly as the NPU platform would call them.
"""

from __future__ import annotations

import pytest

from ascend_kernel.device import DeviceInfo
from ascend_kernel.kernel import SelectionContext
from ascend_kernel.settings import load_settings


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("llama", tmp_path_factory.mktemp("g") / "llama")


def config(llama_dir, **model_kwargs):
    from vllm.config import ModelConfig, VllmConfig

    return VllmConfig(model_config=ModelConfig(model=str(llama_dir), max_model_len=128, **model_kwargs))


def test_enforce_eager_turns_graphs_off(llama_dir):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    from ascend_kernel_plugins.graph.modes import resolve_npu_graph_config

    cfg = config(llama_dir, enforce_eager=True)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    changes = resolve_npu_graph_config(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert {c.path for c in changes} >= {"compilation_config.cudagraph_mode"}
    assert all(c.reason for c in changes)


def test_full_and_piecewise_falls_back_to_piecewise_without_inductor(llama_dir):
    from vllm.config.compilation import CUDAGraphMode

    from ascend_kernel_plugins.graph.modes import resolve_npu_graph_config

    cfg = config(llama_dir)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cfg.compilation_config.backend = "inductor"
    changes = resolve_npu_graph_config(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert cfg.compilation_config.backend == "eager"
    assert "compilation_config.backend" in {c.path for c in changes}


def test_full_decode_only_captures_unsplit(llama_dir):
    from vllm.config.compilation import CUDAGraphMode

    from ascend_kernel_plugins.graph.modes import resolve_npu_graph_config

    cfg = config(llama_dir)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cfg.compilation_config.splitting_ops = ["vllm::unified_attention"]
    resolve_npu_graph_config(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert cfg.compilation_config.splitting_ops == []


def test_default_capture_size_tracks_decode_batch_capped_at_512(llama_dir):
    from types import SimpleNamespace

    from ascend_kernel_plugins.graph.modes import default_max_capture_size

    def cfg(seqs, spec_tokens=None, max_size=None, sizes=None):
        return SimpleNamespace(
            compilation_config=SimpleNamespace(max_cudagraph_capture_size=max_size, cudagraph_capture_sizes=sizes),
            scheduler_config=SimpleNamespace(max_num_seqs=seqs),
            speculative_config=SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None,
        )

    assert default_max_capture_size(cfg(64)) == 64
    assert default_max_capture_size(cfg(64, spec_tokens=3)) == 256
    assert default_max_capture_size(cfg(256, spec_tokens=3)) == 512
    assert default_max_capture_size(cfg(64, max_size=32)) is None
    assert default_max_capture_size(cfg(64, sizes=[1, 2])) is None


def test_graph_mode_choice_by_device(llama_dir):
    from ascend_kernel.kernel import GLOBAL_FAMILIES, build_kernel
    from ascend_kernel.registry import choose

    family = next(f for f in GLOBAL_FAMILIES if f.name == "graph")
    kernel = build_kernel(load_settings(), "cpu")
    entries = kernel.entries(family)
    for device, eager, expected in (("cpu", False, "eager"), ("npu", False, "aclgraph"), ("npu", True, "eager")):
        ctx = SelectionContext(config(llama_dir, enforce_eager=eager), kernel.settings, DeviceInfo(device, "A2"))
        impl, record = choose("graph", entries, ctx, forced=None, forcing_setting="ASCEND_KERNEL_GRAPH_MODE")
        assert impl.name == expected, (device, eager, record)


def test_aclgraph_pads_to_the_next_captured_size():
    from ascend_kernel_plugins.graph.modes import AclGraphMode, EagerMode

    mode = AclGraphMode([8, 1, 4, 2])
    assert [mode.padded_num_tokens(n) for n in (1, 3, 5, 8, 9)] == [1, 4, 8, 8, 9]
    assert EagerMode().padded_num_tokens(7) == 7


def test_npu_fixups_reset_gpu_only_options_and_record_them(llama_dir):
    from ascend_kernel_plugins.config_fixups.plugin import ascend_kernel_configure

    cfg = config(llama_dir)
    cfg.model_config.disable_cascade_attn = True
    cfg.scheduler_config.max_num_partial_prefills = 4
    cfg.attention_config.use_trtllm_attention = True
    changes = ascend_kernel_configure(load_settings(), cfg, DeviceInfo("npu", "A3"))
    paths = {c.path for c in changes}
    assert {"model_config.disable_cascade_attn", "scheduler_config.max_num_partial_prefills",
            "attention_config.use_trtllm_attention"} <= paths
    assert cfg.model_config.disable_cascade_attn is False
    assert cfg.scheduler_config.max_num_partial_prefills == 1
    assert cfg.attention_config.use_trtllm_attention is False
    # on the CPU device nothing is touched
    cfg2 = config(llama_dir)
    cfg2.scheduler_config.max_num_partial_prefills = 4
    assert ascend_kernel_configure(load_settings(), cfg2, DeviceInfo("cpu", None)) is None
    assert cfg2.scheduler_config.max_num_partial_prefills == 4


def test_fused_mc2_and_hierarchy_are_refused_at_load():
    """Neither MC2 kernel toggle is implemented: each is refused on its own (tests/test_settings_read.py: all)."""
    from ascend_kernel.errors import SettingsError

    with pytest.raises(SettingsError) as info:
        load_settings({"ascend_kernel": {"enable_fused_mc2": True, "enable_mc2_hierarchy_comm": True}})
    assert "enable_fused_mc2\"]=True is refused" in str(info.value)
    assert "enable_mc2_hierarchy_comm\"]=True is refused" in str(info.value)


def test_npu_platform_class_imports_with_ascend_device_facts():
    from ascend_kernel.platform.npu import KernelNpuPlatform

    assert (KernelNpuPlatform.device_type, KernelNpuPlatform.dispatch_key, KernelNpuPlatform.dist_backend) == (
        "npu", "PrivateUse1", "hccl")
    assert KernelNpuPlatform.device_control_env_var == "ASCEND_RT_VISIBLE_DEVICES"


@pytest.mark.parametrize("arch", ["mamba2", "falcon_h1"])
def test_npu_refuses_prefix_caching_and_spec_decode_for_mamba_state(tmp_path, arch):
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.errors import SettingsError
    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.kv_cache.mamba import ascend_kernel_configure

    path = create_tiny_model(arch, tmp_path / arch)
    cfg = VllmConfig(model_config=ModelConfig(model=str(path), max_model_len=128))
    cfg.cache_config.enable_prefix_caching = True
    with pytest.raises(SettingsError, match="prefix caching is not supported.*enable_prefix_caching=False"):
        ascend_kernel_configure(load_settings(), cfg, DeviceInfo("npu", "A2"))
    assert ascend_kernel_configure(load_settings(), cfg, DeviceInfo("cpu", None)) is None  # vLLM-CPU handles it
    cfg.cache_config.enable_prefix_caching = False
    assert ascend_kernel_configure(load_settings(), cfg, DeviceInfo("npu", "A2")) is None


def test_npu_mamba_limits_leave_attention_models_alone(llama_dir):
    from ascend_kernel_plugins.kv_cache.mamba import ascend_kernel_configure

    cfg = config(llama_dir)
    cfg.cache_config.enable_prefix_caching = True
    assert ascend_kernel_configure(load_settings(), cfg, DeviceInfo("npu", "A2")) is None


def test_mla_scheduling_is_given_back_only_for_the_ascend_backend(tmp_path):
    import copy
    from types import SimpleNamespace

    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.attention.cpu_fixups import restore_mla_scheduling

    path = create_tiny_model("deepseek_v2", tmp_path / "ds")
    cfg = VllmConfig(model_config=ModelConfig(model=str(path), max_model_len=128))
    cfg.scheduler_config.enable_chunked_prefill = True
    cfg.cache_config.enable_prefix_caching = True
    requested = SimpleNamespace(scheduler_config=copy.copy(cfg.scheduler_config),
                                cache_config=copy.copy(cfg.cache_config))
    # what vLLM-CPU does to MLA models on hosts without AMX
    cfg.scheduler_config.enable_chunked_prefill = False
    cfg.cache_config.enable_prefix_caching = False
    assert restore_mla_scheduling(cfg, requested, "vllm-native") == []
    assert cfg.scheduler_config.enable_chunked_prefill is False
    changes = restore_mla_scheduling(cfg, requested, "ascend")
    assert {c.path for c in changes} >= {"scheduler_config.enable_chunked_prefill", "cache_config.enable_prefix_caching"}
    assert cfg.scheduler_config.enable_chunked_prefill is True and cfg.cache_config.enable_prefix_caching is True


def test_cpu_config_hook_knows_sparse_models_go_to_the_ascend_backend(tmp_path, llama_dir):
    """Unforced, a sparse model's config is fixed for the Ascend backend it will get (no CPU_MLA pin)."""
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.attention.backends import cpu_backend_choice
    from ascend_kernel_plugins.attention.cpu_fixups import mla_cpu_fixups

    sparse = VllmConfig(model_config=ModelConfig(model=str(create_tiny_model("deepseek_v32", tmp_path / "v32")),
                                                 max_model_len=128))
    dense = config(llama_dir)
    assert cpu_backend_choice("auto", sparse) == "ascend"
    assert cpu_backend_choice("auto", dense) == "vllm-native"
    assert cpu_backend_choice("vllm-native", sparse) == "vllm-native"  # forced: the registry then refuses it
    changes = {c.path for c in mla_cpu_fixups(sparse, cpu_backend_choice("auto", sparse))}
    assert "attention_config.backend" not in changes and sparse.attention_config.backend is None
    assert "compilation_config.custom_ops" in changes


def test_inductor_compiles_run_without_the_peak_memory_reorder(llama_dir):
    """vLLM's compilation gets the override (recorded once); a user's own value and non-inductor configs stand."""
    from vllm.config import CompilationMode

    from vllm.compilation.passes.inductor_pass import InductorPass

    from ascend_kernel.ops.pass_manager import POST_GRAD_KEY, SeamFusionPasses
    from ascend_kernel_plugins.graph.inductor_fixups import compilation_fixups, kernel_inductor_options

    cfg = config(llama_dir)
    cfg.compilation_config.mode, cfg.compilation_config.backend = CompilationMode.DYNAMO_TRACE_ONCE, "inductor"
    cfg.compilation_config.inductor_compile_config = {"dce": True}
    [change] = compilation_fixups(cfg)
    assert "fusion" in change.reason and "SeamFusionPasses()" in change.as_dict()["new"]
    options = cfg.compilation_config.inductor_compile_config
    passes = options.pop(POST_GRAD_KEY)
    assert isinstance(passes, SeamFusionPasses) and isinstance(passes, InductorPass)  # what vLLM's config accepts
    assert options == {"dce": True, "reorder_for_peak_memory": False}
    assert change.path == "compilation_config.inductor_compile_config" and "reorder" in change.reason
    options[POST_GRAD_KEY] = passes
    assert compilation_fixups(cfg) == []  # idempotent

    user_pass = SeamFusionPasses()
    cfg.compilation_config.inductor_compile_config = {"reorder_for_peak_memory": True, POST_GRAD_KEY: user_pass}
    assert compilation_fixups(cfg) == [] and cfg.compilation_config.inductor_compile_config == {
        "reorder_for_peak_memory": True, POST_GRAD_KEY: user_pass}
    cfg.compilation_config.mode = CompilationMode.VLLM_COMPILE  # vLLM's backend: the platform's manager runs them
    cfg.compilation_config.inductor_compile_config = {}
    [change] = compilation_fixups(cfg)
    assert cfg.compilation_config.inductor_compile_config == {"reorder_for_peak_memory": False}
    for mode, backend in ((CompilationMode.NONE, "inductor"), (CompilationMode.DYNAMO_TRACE_ONCE, "eager")):
        cfg.compilation_config.mode, cfg.compilation_config.backend = mode, backend
        cfg.compilation_config.inductor_compile_config = {}
        assert compilation_fixups(cfg) == [] and cfg.compilation_config.inductor_compile_config == {}

    import torch._inductor.config as inductor_config

    before = inductor_config.reorder_for_peak_memory
    with kernel_inductor_options():
        assert inductor_config.reorder_for_peak_memory is False
        assert isinstance(getattr(inductor_config, POST_GRAD_KEY), SeamFusionPasses)
    assert inductor_config.reorder_for_peak_memory == before
    assert getattr(inductor_config, POST_GRAD_KEY) is None

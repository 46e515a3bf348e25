"""Where the fusion passes run and what they say: inductor's post-grad hook, the platform's pass manager, records.

The compile test runs inductor for real on a small function (the kernel's
compile options, as vLLM-CPU's default compilation and cpu-graph pass them);
the table of passes is the one a kernel would build, handed over directly.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ascend_kernel.ops import get_ops
from ascend_kernel.ops import pass_manager
from ascend_kernel.ops.pass_manager import POST_GRAD_KEY, SeamFusionPasses, SeamPassManager, fusion_report
from ascend_kernel.registry import Candidate, DecisionRecord
from ascend_kernel.settings import load_settings
from ascend_kernel_plugins.fusion import plugin
from ascend_kernel_plugins.fusion.passes import NormQuantPass, QkNormRopePass

ops = get_ops("reference", "cpu")


def _qk(qkv, positions, q_weight, k_weight, cache):
    q, k, v = qkv.split([64, 32, 32], dim=-1)
    q = ops.rms_norm(q.view(-1, 4, 16), q_weight, 1e-6)[0].view(q.shape)
    k = ops.rms_norm(k.view(-1, 2, 16), k_weight, 1e-6)[0].view(k.shape)
    q, k = ops.rope(positions, q, k, 16, cache, True)
    return q * 2, k + 1, v


def test_inductor_runs_the_passes_under_the_kernels_compile_options(monkeypatch):
    fusion = QkNormRopePass()
    monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [fusion])
    gen = torch.Generator().manual_seed(5)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    angles = torch.arange(32).float()[:, None] * inv[None]
    inputs = (torch.randn(3, 128, generator=gen), torch.tensor([0, 5, 9]), torch.randn(16, generator=gen),
              torch.randn(16, generator=gen), torch.cat([angles.cos(), angles.sin()], -1))
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(_qk, backend="inductor", fullgraph=True, options={POST_GRAD_KEY: SeamFusionPasses()})
        got = compiled(*inputs)
    assert fusion.matches == 1 and fusion.graphs == 1
    for a, b in zip(got, _qk(*inputs)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # inductor's own codegen around the fused op


def test_seam_pass_manager_is_vllms_with_the_fusion_passes_first():
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.config import VllmConfig

    from ascend_kernel.platform.common import KernelPlatformMixin

    assert KernelPlatformMixin.get_pass_manager_cls() == "ascend_kernel.ops.pass_manager.SeamPassManager"
    manager = SeamPassManager()
    manager.configure(VllmConfig())
    assert isinstance(manager, PostGradPassManager) and isinstance(manager.passes[0], SeamFusionPasses)
    assert sum(isinstance(p, SeamFusionPasses) for p in manager.passes) == 1


def test_the_cache_key_names_the_enabled_passes_and_their_sources(monkeypatch):
    """Inductor keys its FX graph cache on this uuid: the same passes give the same key in any process (the cache
    serves graphs these passes rewrote), another set of passes another key (never a graph rewritten otherwise)."""
    monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [NormQuantPass()])
    one = SeamFusionPasses().uuid()
    assert one == SeamFusionPasses().uuid() and len(one) == 64
    monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [NormQuantPass(), QkNormRopePass()])
    two = SeamFusionPasses().uuid()
    monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [NormQuantPass("npu")])
    on_npu = SeamFusionPasses().uuid()
    monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [])
    none = SeamFusionPasses().uuid()
    assert len({one, two, on_npu, none}) == 4
    assert repr(SeamFusionPasses()) == "SeamFusionPasses()"


def test_the_managers_cache_key_folds_in_the_fusion_passes(monkeypatch):
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.config import VllmConfig
    from vllm.config.utils import Range

    manager = SeamPassManager()
    manager.configure(VllmConfig())
    with pass_context(Range(start=1, end=8)):  # vLLM's backend keys each compile range apart
        monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [NormQuantPass()])
        with_pass = manager.uuid()
        monkeypatch.setattr(pass_manager, "fusion_passes", lambda kernel=None: [])
        assert isinstance(with_pass, str) and manager.uuid() != with_pass


def test_report_lists_every_pass_with_its_matches_or_why_not():
    built = NormQuantPass()
    built.matches = 3
    record = DecisionRecord(family="fusion_pass", subject="", chosen="norm-quant", plugin="fusion",
                            entry_point=None, forced_by="table", candidates=(
                                Candidate("norm-quant", "fusion", "", 30, True, "built"),
                                Candidate("muls-add", "fusion", "", 10, False, "unsupported: forced off")))
    kernel = SimpleNamespace(records=[record], plan=SimpleNamespace(tables={"fusion_pass": {"norm-quant": built}}))
    assert fusion_report(kernel) == [
        {"name": "norm-quant", "enabled": True, "matches": 3, "graphs": 0, "skipped": {}},
        {"name": "muls-add", "enabled": False, "matches": 0, "why": "unsupported: forced off"}]


def _ctx(kind="cpu", dtype=torch.float32, scale=None, **settings):
    hf = SimpleNamespace(routed_scaling_factor=scale) if scale is not None else SimpleNamespace()
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype, hf_text_config=hf))
    return SimpleNamespace(settings=load_settings({"ascend_kernel": settings}), device=SimpleNamespace(kind=kind),
                           vllm_config=config)


def _why(ctx):
    return {e.name: e.supports(ctx) for e in plugin.ascend_kernel_fusion_passes()}


def test_each_pass_says_why_it_cannot_apply():
    on = {"norm-quant": None, "qknorm-rope": None, "muls-add": None}
    assert _why(_ctx(layer_ops="ascend", scale=2.5, fuse_muls_add=True)) == on
    assert _why(_ctx("npu", torch.bfloat16, scale=2.5)) == on
    cpu_default = _why(_ctx())
    assert "layer_ops" in cpu_default["norm-quant"] and "ASCEND_KERNEL_LAYER_OPS=ascend" in cpu_default["qknorm-rope"]
    assert "routed_scaling_factor" in cpu_default["muls-add"]
    assert "routed_scaling_factor" in _why(_ctx(scale=1.0))["muls-add"]  # vLLM multiplies by none
    npu = _why(_ctx("npu", torch.float32))
    assert "float16/bfloat16" in npu["norm-quant"] and _why(_ctx("npu", torch.bfloat16))["norm-quant"] is None


def test_muls_add_stands_down_on_a_cpu_host_unless_set_explicitly():
    """Inductor already fuses the plain mul + add on CPU (bench/fusion.py): the default there is off, with why."""
    why = _why(_ctx(layer_ops="ascend", scale=2.5))["muls-add"]
    assert "stands down on a CPU host" in why and "ASCEND_KERNEL_FUSE_MULS_ADD=true forces it on" in why
    assert _why(_ctx(scale=2.5, fuse_muls_add=True))["muls-add"] is None
    assert _why(_ctx("npu", torch.bfloat16, scale=2.5))["muls-add"] is None  # the NPU's one kernel for two


@pytest.mark.parametrize("setting,name", [("fuse_norm_quant", "norm-quant"), ("fuse_qknorm_rope", "qknorm-rope"),
                                          ("fuse_muls_add", "muls-add")])
def test_a_setting_forces_its_pass_off(setting, name):
    # muls-add set on explicitly (its CPU default stands down), unless it is the one forced off
    why = _why(_ctx(layer_ops="ascend", scale=2.5, **{"fuse_muls_add": True, setting: False}))
    assert why[name] is not None and f"ASCEND_KERNEL_{setting.upper()}=false" in why[name]
    assert sum(v is not None for v in why.values()) == 1

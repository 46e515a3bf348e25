"""The plugin manager with real entry points: fake installed distributions on sys.path.

Each test writes a ``<name>-1.0.dist-info`` folder (METADATA + entry_points.txt)
and the plugin modules it points at into ``tmp_path``, prepends ``tmp_path`` to
``sys.path`` and lets :func:`importlib.metadata.entry_points` find them, exactly
as it finds a pip-installed plugin.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ascend_kernel.device import DeviceInfo
from ascend_kernel.errors import PluginError, SelectionError, SettingsError
from ascend_kernel.entry_points import discover_entry_points
from ascend_kernel.plugin_manager import KernelPluginManager
from ascend_kernel.registry import choose
from ascend_kernel.settings import ENV_PREFIX, load_settings
from fake_plugins import install  # noqa: F401 - the fixture

THIRDPARTY = Path(__file__).resolve().parent / "thirdparty"
ESSENTIAL = ("attention", "graph", "kv-cache-standard", "layers", "sampling", "tp-comm")
BUILTINS = (
    "attention", "config-fixups", "eplb", "eplb-policies", "fusion", "graph", "kv-cache-int8-bsh", "kv-cache-mamba",
    "kv-cache-mla", "kv-cache-sfa",
    "kv-cache-standard", "kv-cache-vllm-views", "kv-transfer", "layers", "moe-comm", "moe-comm-allgather", "moe-comm-alltoall",
    "moe-comm-mc2", "moe-comm-naive-multicast", "quantization", "sampling", "sleep-mode", "spec-decode-draft-model",
    "spec-decode-eagle", "spec-decode-mtp", "spec-decode-ngram", "spec-decode-vllm", "tp-comm", "vllm-ascend-keys",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


def manager(**additional):
    return KernelPluginManager(load_settings({"ascend_kernel": additional} if additional else None))


def info_of(pm, name):
    return next(i for i in pm.infos if i.name == name)


CTX = SimpleNamespace(vllm_config=None, settings=load_settings())
CPU = DeviceInfo(kind="cpu", soc=None)

SAMPLER_PLUGIN = """
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation


class DemoSampler:
    pass


@hookimpl
def ascend_kernel_samplers():
    return [Implementation(family="sampler", name="Demo_Sampler", priority=50,
                           factory=lambda ctx: DemoSampler())]
"""


# -- built-ins ---------------------------------------------------------------------------


def test_builtins_load_in_name_order():
    pm = manager()
    assert tuple(i.name for i in pm.infos) == BUILTINS
    assert all(i.builtin and i.status == "loaded" and i.distribution == "ascend-kernel" for i in pm.infos)
    assert {i.name for i in pm.infos if i.essential} == set(ESSENTIAL)
    assert info_of(pm, "sampling").hooks == ["ascend_kernel_rejection_samplers", "ascend_kernel_samplers",
                                            "ascend_kernel_settings"]  # its own settings model
    assert info_of(pm, "moe-comm").entry_point == \
        "ascend_kernel.plugins: moe_comm = ascend_kernel_plugins.moe_comm.plugin"


# -- (a) a third-party plugin is discovered and can win ------------------------------


def test_thirdparty_sampler_discovered_and_chosen(install):
    eps = install({"demo": SAMPLER_PLUGIN})
    pm = manager()
    names = [i.name for i in pm.infos]
    assert names == [*BUILTINS, "demo"]
    demo = info_of(pm, "demo")
    assert (demo.builtin, demo.status, demo.distribution) == (False, "loaded", "thirdparty-demo")
    assert demo.entry_point == eps["demo"]
    assert demo.hooks == ["ascend_kernel_samplers"]
    assert demo.as_dict()["essential"] is None

    entries = pm.implementations("ascend_kernel_samplers", "sampler")
    assert sorted(e.name for e in entries) == ["ascend-topk-topp", "demo-sampler", "fast-cpu", "vllm-default"]
    chosen, record = choose("sampler", entries, CTX, forced=None, forcing_setting="ASCEND_KERNEL_SAMPLER")
    assert chosen.name == "demo-sampler"
    assert record.plugin == "demo"
    assert record.entry_point == eps["demo"]
    assert record.forced_by == "highest priority (50)"
    cands = {c.name: c for c in record.candidates}
    assert cands["vllm-default"].reason == "lower priority (0 < 50)"
    assert cands["vllm-default"].plugin == "sampling"
    assert type(chosen.build(CTX)).__name__ == "DemoSampler"

    # forcing the built-in back still works, and names the setting
    chosen, record = choose("sampler", entries, CTX, forced="vllm-default", forcing_setting="ASCEND_KERNEL_SAMPLER")
    assert chosen.plugin == "sampling"
    assert record.forced_by == "setting ASCEND_KERNEL_SAMPLER=vllm-default"


def test_thirdparty_plugins_sorted_by_name_after_builtins(install):
    install({"zeta": "x = 1\n", "Alpha_Plug": "x = 2\n"})
    pm = manager()
    assert [i.name for i in pm.infos] == [*BUILTINS, "alpha-plug", "zeta"]
    eps = discover_entry_points()
    assert [e.name for e in eps][-2:] == ["Alpha_Plug", "zeta"]
    # a plugin with no hooks loads fine and offers nothing
    assert info_of(pm, "zeta").status == "loaded" and info_of(pm, "zeta").hooks == []


def test_same_name_as_a_builtin_is_rejected(install):
    install({"sampling": SAMPLER_PLUGIN})
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert "Two plugins are named 'sampling'" in msg
    assert "ascend_kernel_plugins.sampling.plugin" in msg and "ak_tp_" in msg


def test_duplicate_implementation_name_across_plugins(install):
    clash = SAMPLER_PLUGIN.replace('"Demo_Sampler"', '"vllm_default"')
    eps = install({"copycat": clash})
    pm = manager()
    with pytest.raises(SelectionError) as info:
        choose("sampler", pm.implementations("ascend_kernel_samplers", "sampler"), CTX, forced=None,
               forcing_setting="ASCEND_KERNEL_SAMPLER")
    msg = str(info.value)
    assert "plugin 'sampling'" in msg and f"plugin 'copycat' ({eps['copycat']})" in msg


# -- (b) import failures -------------------------------------------------------------------


BROKEN = "raise ImportError('needs the missing package foo')\n"


def test_import_failure_is_a_warning_by_default(install, caplog):
    eps = install({"broken": BROKEN, "fine": SAMPLER_PLUGIN})
    with caplog.at_level(logging.WARNING, logger="ascend_kernel"):
        pm = manager()
    broken = info_of(pm, "broken")
    assert broken.status == "failed"
    assert broken.detail == "ImportError: needs the missing package foo"
    assert broken.hooks == []
    assert info_of(pm, "fine").status == "loaded"  # the others still load
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'broken'" in w and eps["broken"] in w and "missing package foo" in w for w in warnings)


def test_import_failure_is_an_error_when_allowlisted(install, monkeypatch):
    eps = install({"broken": BROKEN})
    monkeypatch.setenv("ASCEND_KERNEL_PLUGINS", ",".join([*ESSENTIAL, "Broken"]))
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert "'broken'" in msg and eps["broken"] in msg
    assert "ASCEND_KERNEL_PLUGINS" in msg and "missing package foo" in msg


def test_import_failure_of_a_disabled_plugin_is_silent(install, monkeypatch, caplog):
    install({"broken": BROKEN})
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "broken")
    with caplog.at_level(logging.WARNING, logger="ascend_kernel"):
        pm = manager()
    assert info_of(pm, "broken").status == "failed"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- (c) (d) invalid hooks --------------------------------------------------------------------


def test_unknown_hook_names_plugin_and_entry_point(install):
    eps = install({"oddball": """
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_nonexistent():
            return []
    """})
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert "'oddball'" in msg and eps["oddball"] in msg
    assert "unknown hook" in msg and "ascend_kernel_nonexistent" in msg
    assert "ascend_kernel_samplers" in msg  # the known hooks are listed


def test_hookimpl_with_argument_the_spec_lacks(install):
    eps = install({"greedy-args": """
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_configure(settings, vllm_config, device, engine_id):
            return None
    """})
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert "'greedy-args'" in msg and eps["greedy-args"] in msg
    assert "invalid hook" in msg and "engine_id" in msg


def test_hookimpl_with_a_subset_of_arguments_is_fine(install):
    install({"subset": """
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_configure(device):
            return [device.kind]
    """})
    pm = manager()
    results = dict(pm.call_each("ascend_kernel_configure", settings=pm.settings, vllm_config=None, device=CPU, requested=None))
    assert results["subset"] == ["cpu"]


# -- (e) allow/deny lists ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin", "hook", "family"),
    [
        ("moe-comm", "ascend_kernel_moe_comm_policies", "moe_comm"),
        ("spec-decode-ngram", "ascend_kernel_drafters", "drafter"),
    ],
)
def test_disable_non_essential_builtin(monkeypatch, plugin, hook, family):
    before = {(e.plugin, e.name) for e in manager().implementations(hook, family)}
    assert any(p == plugin for p, _ in before)
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", plugin.upper().replace("-", "_"))
    pm = manager()
    info = info_of(pm, plugin)
    assert info.status == "disabled"
    assert info.detail == "ASCEND_KERNEL_DISABLE_PLUGINS"
    assert info.hooks == []
    after = {(e.plugin, e.name) for e in pm.implementations(hook, family)}
    assert after == {x for x in before if x[0] != plugin}
    assert plugin not in [name for name, _ in pm.loaded()]


@pytest.mark.parametrize("plugin", ["sampling", "kv_cache_standard", "attention", "graph"])
def test_disabling_an_essential_builtin_is_refused(monkeypatch, plugin):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", plugin)
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert f"'{plugin.replace('_', '-')}'" in msg
    assert "essential" in msg and "ASCEND_KERNEL_DISABLE_PLUGINS" in msg


def test_allowlist_must_include_essentials(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_PLUGINS", "attention,graph,kv-cache-standard,layers")
    with pytest.raises(PluginError, match=r"'sampling'.*ASCEND_KERNEL_PLUGINS \(not listed\).*essential"):
        manager()


def test_allowlist_leaves_others_not_allowed(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_PLUGINS", ",".join(ESSENTIAL))
    pm = manager()
    statuses = {i.name: i.status for i in pm.infos}
    assert {n for n, s in statuses.items() if s == "loaded"} == set(ESSENTIAL)
    assert statuses["moe-comm"] == "not allowed"
    assert info_of(pm, "moe-comm").detail == "not in ASCEND_KERNEL_PLUGINS"
    assert pm.implementations("ascend_kernel_moe_comm_policies", "moe_comm") == []


@pytest.mark.parametrize("var", ["ASCEND_KERNEL_DISABLE_PLUGINS", "ASCEND_KERNEL_PLUGINS"])
def test_unknown_names_in_lists_are_errors(monkeypatch, var):
    names = "no-such-plugin" if var.endswith("DISABLE_PLUGINS") else ",".join([*ESSENTIAL, "no-such-plugin"])
    monkeypatch.setenv(var, names)
    with pytest.raises(PluginError) as info:
        manager()
    msg = str(info.value)
    assert var in msg and "no-such-plugin" in msg
    assert "Installed: " + ", ".join(sorted(BUILTINS)) in msg


def test_disable_a_thirdparty_plugin_via_additional_config(install):
    install({"demo": SAMPLER_PLUGIN})
    pm = manager(disable_plugins=["demo"])
    assert info_of(pm, "demo").status == "disabled"
    assert [e.name for e in pm.implementations("ascend_kernel_samplers", "sampler")] == ["vllm-default",
                                                                                       "ascend-topk-topp", "fast-cpu"]


def test_disable_plugins_none_is_not_a_crash():
    try:
        pm = manager(disable_plugins=None)
    except SettingsError:
        return  # rejecting the value cleanly is fine too
    assert info_of(pm, "moe-comm").status == "loaded"


# -- (f) (g) hooks that fail at call time -------------------------------------------------------------


def test_hook_that_raises_names_plugin_and_entry_point(install):
    eps = install({"explosive": """
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_samplers():
            raise ZeroDivisionError("bad arithmetic")
    """})
    pm = manager()
    with pytest.raises(PluginError) as info:
        pm.implementations("ascend_kernel_samplers", "sampler")
    msg = str(info.value)
    assert "ascend_kernel_samplers" in msg and "'explosive'" in msg and eps["explosive"] in msg
    assert "ZeroDivisionError: bad arithmetic" in msg


def test_hook_raising_a_kernel_error_keeps_its_type(install):
    eps = install({"strict": """
        from ascend_kernel.errors import SettingsError
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_configure(settings):
            raise SettingsError("this model needs ASCEND_KERNEL_ENABLE_DBO=1")
    """})
    pm = manager()
    with pytest.raises(SettingsError) as info:
        pm.call_each("ascend_kernel_configure", settings=pm.settings, vllm_config=None, device=CPU, requested=None)
    msg = str(info.value)
    assert "plugin 'strict'" in msg and eps["strict"] in msg and "ENABLE_DBO=1" in msg


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ("return ['not an implementation']", "'not an implementation'"),
        ("return [Implementation(family='drafter', name='x', factory=lambda c: c)]", "family='drafter'"),
    ],
)
def test_registration_hook_returning_wrong_entries(install, body, shown):
    eps = install({"sloppy": f"""
        from ascend_kernel.hookspecs import hookimpl
        from ascend_kernel.registry import Implementation

        @hookimpl
        def ascend_kernel_samplers():
            {body}
    """})
    pm = manager()
    with pytest.raises(PluginError) as info:
        pm.implementations("ascend_kernel_samplers", "sampler")
    msg = str(info.value)
    assert "'sloppy'" in msg and eps["sloppy"] in msg and shown in msg
    assert "expected ascend_kernel.registry.Implementation entries of family 'sampler'" in msg


def test_call_each_only_calls_implementers_and_keeps_origin(install):
    install({"demo": SAMPLER_PLUGIN})
    pm = manager()
    names = [name for name, _ in pm.call_each("ascend_kernel_samplers")]
    assert names == ["sampling", "demo"]
    entries = pm.implementations("ascend_kernel_samplers", "sampler")
    assert {(e.name, e.plugin) for e in entries} == {("vllm-default", "sampling"), ("ascend-topk-topp", "sampling"),
                                                     ("fast-cpu", "sampling"), ("demo-sampler", "demo")}
    assert pm.entry_point_of("nobody") == "?"


# -- the reusable plugin under tests/thirdparty ---------------------------------------------


@pytest.fixture
def demo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(THIRDPARTY))
    importlib.invalidate_caches()
    yield
    importlib.invalidate_caches()


def test_tests_thirdparty_plugin_is_discovered(demo_on_path):
    pm = manager()
    demo = info_of(pm, "demo")
    assert [i.name for i in pm.infos if not i.builtin] == ["demo", "drafter-demo", "moe-demo"]  # third parties last, by name
    assert (demo.status, demo.builtin, demo.distribution) == ("loaded", False, "ak-demo-plugin")
    assert demo.entry_point == "ascend_kernel.plugins: demo = ak_demo_plugin"
    assert demo.hooks == ["ascend_kernel_samplers"]
    entries = pm.implementations("ascend_kernel_samplers", "sampler")
    chosen, record = choose("sampler", entries, CTX, forced=None, forcing_setting="ASCEND_KERNEL_SAMPLER")
    assert (chosen.name, chosen.priority, record.plugin) == ("demo-greedy", 50, "demo")
    assert record.entry_point == "ascend_kernel.plugins: demo = ak_demo_plugin"


def test_tests_thirdparty_plugin_not_seen_without_path():
    assert "demo" not in [i.name for i in manager().infos]


def test_tests_thirdparty_sampler_behaves_like_vllm_sampler(demo_on_path):
    import torch

    pm = manager()
    entries = pm.implementations("ascend_kernel_samplers", "sampler")
    chosen, _ = choose("sampler", entries, CTX, forced=None, forcing_setting="ASCEND_KERNEL_SAMPLER")
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode="raw_logprobs", use_fp64_gumbel=False))
    sampler = chosen.build(CTX).build(vllm_config)

    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    import ak_demo_plugin

    assert type(sampler) is ak_demo_plugin.DemoSampler
    assert type(sampler).__name__ == "DemoSampler" and isinstance(sampler, Sampler)
    assert sampler.logprobs_mode == "raw_logprobs"

    n, vocab = 3, 11
    metadata = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=2, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n), presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n), output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
    before = ak_demo_plugin.DemoSampler.calls
    got = sampler(logits=logits.clone(), sampling_metadata=metadata)
    want = Sampler()(logits=logits.clone(), sampling_metadata=metadata)
    assert ak_demo_plugin.DemoSampler.calls == before + 1
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert torch.equal(got.sampled_token_ids[:, 0].long(), logits.argmax(dim=-1))
    assert torch.equal(got.logprobs_tensors.logprob_token_ids, want.logprobs_tensors.logprob_token_ids)
    assert torch.allclose(got.logprobs_tensors.logprobs, want.logprobs_tensors.logprobs)

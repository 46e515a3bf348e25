"""Settings declared by plugins (``ascend_kernel_settings``): composition, ownership, clashes, disabled plugins."""

from __future__ import annotations

import os
import pickle

import pytest
from pydantic import BaseModel, Field

from ascend_kernel.errors import PluginError, SettingsError
from ascend_kernel.entry_points import declared_settings
from ascend_kernel.plugin_manager import KernelPluginManager
from ascend_kernel.cli.settings_doc import describe_settings
from ascend_kernel.settings import (
    ENV_PREFIX, KernelSettings, compose_settings, load_settings, settings_model,
)
from ascend_kernel_plugins.graph.settings import GraphSettings
from ascend_kernel_plugins.moe_comm.settings import MoECommSettings
from fake_plugins import install  # noqa: F401 - the fixture


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


class DemoSettings(BaseModel):
    demo_threshold: int = Field(3, ge=1, description="A third party's knob.")
    demo_fast: bool = Field(False, description="Another.")


class ClashingSettings(BaseModel):
    demo_fast: bool = Field(True, description="The same name as DemoSettings'.")


#: what the built-in plugins declare, and who owns each moved setting
OWNERS = {
    "mc2_min_world_size": "moe-comm", "enable_fused_mc2": "moe-comm", "enable_mc2_hierarchy_comm": "moe-comm",
    "enable_topk_topp_optimization": "sampling", "graph_capture_sizes": "graph", "graph_capture_mode": "graph",
    "kv_transfer_pull_timeout_s": "kv-transfer", "kv_transfer_alignment_bytes": "kv-cache-standard",
}
CORE = {"device", "ops_provider", "soc", "plugins", "disable_plugins", "trace_plugins", "attention_backend",
        "attention_state", "attention_mask", "kv_cache_layout", "moe_comm", "moe_comm_method", "drafter", "sampler",
        "rejection_sampler", "graph_mode", "layer_ops", "engine_liveness_timeout_s", "enable_dbo",
        "enable_prefetch_mlp"}


def test_core_keeps_only_kernel_wide_settings_and_plugins_own_the_rest():
    assert set(KernelSettings.model_fields) >= CORE
    assert not set(OWNERS) & set(KernelSettings.model_fields)
    model = settings_model()
    assert {name: model.owners[name] for name in OWNERS} == OWNERS
    rows = {r["name"]: r for r in describe_settings()}
    assert {n: rows[n]["plugin"] for n in OWNERS} == OWNERS
    assert all(rows[n]["plugin"] is None for n in CORE)


def test_the_composed_object_reads_plugin_settings_as_attributes_and_is_each_model():
    s = load_settings({"ascend_kernel": {"mc2_min_world_size": 4, "graph_capture_sizes": "8,2"}})
    assert (s.mc2_min_world_size, s.graph_capture_sizes) == (4, [2, 8])  # the graph plugin's validator applies
    assert isinstance(s, KernelSettings) and isinstance(s, MoECommSettings) and isinstance(s, GraphSettings)
    with pytest.raises(AttributeError):
        s.mc2_min_world_sise  # noqa: B018 - a typo in code stays an error
    with pytest.raises(Exception):
        s.mc2_min_world_size = 2  # type: ignore[misc]  # frozen like the core's


def test_equal_settings_compare_equal_and_survive_pickling(monkeypatch):
    """Workers rebuild settings from the pickled config; activate() compares them to decide whether to rebuild."""
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "4")
    a, b = load_settings(), load_settings()
    assert a == b and type(a) is type(b)
    assert a != load_settings({"ascend_kernel": {"mc2_min_world_size": 16}})
    restored = pickle.loads(pickle.dumps(a))
    assert restored == a and type(restored) is type(a) and restored.mc2_min_world_size == 4
    core = KernelSettings()
    assert pickle.loads(pickle.dumps(core)) == core


def test_a_plugin_setting_behaves_like_a_core_one(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "0")
    monkeypatch.setenv("ASCEND_KERNEL_GRAPH_CAPTURE_MODE", "full")
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_TOPK_TOPP_OPTIMISATION", "1")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_MC2_MIN_WORLD_SIZE='0' is not allowed" in msg and "allowed: a whole number >= 1" in msg
    assert "ASCEND_KERNEL_GRAPH_CAPTURE_MODE='full' is not allowed" in msg and "'full_decode_only'" in msg
    assert "did you mean ASCEND_KERNEL_ENABLE_TOPK_TOPP_OPTIMIZATION?" in msg
    with pytest.raises(SettingsError, match=r'\["kv_transfer_pull_timeout_sec"\] \(did you mean '
                                            r"'kv_transfer_pull_timeout_s'\?\)"):
        load_settings({"ascend_kernel": {"kv_transfer_pull_timeout_sec": 5}})


def test_third_party_settings_are_composed_and_checked(monkeypatch):
    declared = [("demo", DemoSettings)]
    monkeypatch.setenv("ASCEND_KERNEL_DEMO_THRESHOLD", "7")
    s = load_settings(declared=declared)
    assert (s.demo_threshold, s.demo_fast, s.device) == (7, False, "auto")
    monkeypatch.setenv("ASCEND_KERNEL_DEMO_FAST", "")
    monkeypatch.setenv("ASCEND_KERNEL_DEMO_THRESHOLDS", "1")
    with pytest.raises(SettingsError) as info:
        load_settings(declared=declared)
    msg = str(info.value)
    assert "ASCEND_KERNEL_DEMO_FAST is set but empty; allowed: true or false" in msg
    assert "did you mean ASCEND_KERNEL_DEMO_THRESHOLD?" in msg
    rows = {r["name"]: r for r in describe_settings(declared=declared)}
    assert rows["demo_threshold"]["plugin"] == "demo" and rows["demo_threshold"]["allowed"] == "a whole number >= 1"


def test_two_plugins_declaring_one_name_is_an_error_naming_both():
    with pytest.raises(SettingsError, match=r"setting 'demo_fast' \(ASCEND_KERNEL_DEMO_FAST\) is declared twice: "
                                            r"by plugin 'demo' and by plugin 'other'"):
        compose_settings([("demo", DemoSettings), ("other", ClashingSettings)])


def test_a_plugin_declaring_a_core_name_is_an_error():
    class Bad(BaseModel):
        device: str = "x"

    with pytest.raises(SettingsError, match=r"'device' .* declared twice: by the core and by plugin 'bad'"):
        compose_settings([("bad", Bad)])


def test_a_declaration_that_is_no_model_is_an_error():
    with pytest.raises(SettingsError, match="plugin 'odd' declares settings .*pydantic model class"):
        compose_settings([("odd", dict)])


def test_the_same_models_give_the_same_class():
    assert compose_settings([("demo", DemoSettings)]) is compose_settings([("demo", DemoSettings)])
    assert compose_settings([]) is KernelSettings


# -- a disabled plugin's settings: still checked, no effect ------------------------------------


def test_a_disabled_plugins_setting_is_accepted_and_still_checked(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "moe_comm")
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "4")
    s = load_settings()
    assert s.mc2_min_world_size == 4 and s.disable_plugins == ("moe-comm",)
    manager = KernelPluginManager(s)
    assert next(i for i in manager.infos if i.name == "moe-comm").status == "disabled"
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "0")
    with pytest.raises(SettingsError, match="ASCEND_KERNEL_MC2_MIN_WORLD_SIZE='0'"):
        load_settings()


# -- discovery through entry points --------------------------------------------------------------


PLUGIN = """
from pydantic import BaseModel, Field
from ascend_kernel.hookspecs import hookimpl


class TpSettings(BaseModel):
    tp_window: int = Field(5, ge=1, description="How far the third party looks.")


@hookimpl
def ascend_kernel_settings():
    return TpSettings
"""


@pytest.fixture
def installed(install):
    install({"tp_settings": PLUGIN}, dist="tp-settings")


def test_an_installed_third_party_declares_its_settings_through_the_hook(installed, monkeypatch):
    assert "tp-settings" in [name for name, _ in declared_settings()]
    assert "tp-settings" not in [name for name, _ in declared_settings(builtin_only=True)]
    monkeypatch.setenv("ASCEND_KERNEL_TP_WINDOW", "9")
    s = load_settings()
    assert s.tp_window == 9 and type(s).owners["tp_window"] == "tp-settings"
    KernelPluginManager(s)  # its settings are part of the settings: loads
    rows = {r["name"]: r for r in describe_settings(s)}
    assert rows["tp_window"]["value"] == 9 and rows["tp_window"]["plugin"] == "tp-settings"


def test_a_plugin_whose_settings_were_left_out_is_refused(installed):
    settings = load_settings(declared=declared_settings(builtin_only=True))
    with pytest.raises(PluginError, match=r"Plugin 'tp-settings' \(.*\) declares the settings .*TpSettings.* "
                                          r"composed without them"):
        KernelPluginManager(settings)


def test_every_builtin_settings_field_has_a_description():
    for plugin, model in declared_settings(builtin_only=True):
        for name, info in model.model_fields.items():
            assert info.description, f"{plugin}: {name}"


# -- the conformance kit checks a plugin's settings model ---------------------------------------


BAD_PLUGIN = """
from pydantic import BaseModel, Field
from ascend_kernel.hookspecs import hookimpl


def _make():
    class Hidden(BaseModel):  # not reachable by module and name: workers could not unpickle it
        tpbad_window: int = Field(5, ge=1)  # no description
        tpbad_Mode: str = Field("a", description="not lower case")
    return Hidden


MODEL = _make()


@hookimpl
def ascend_kernel_settings():
    return MODEL
"""


def test_the_kit_passes_the_builtin_settings_models(tmp_path):
    from ascend_kernel.conformance import run_conformance

    report = run_conformance(["moe-comm", "graph", "sampling", "kv-transfer", "kv-cache-standard"],
                             families=["settings"], cache_dir=tmp_path)
    assert report.failures == [], "\n".join(f.line() for f in report.failures)
    rows = {(r.plugin, r.implementation, r.contract) for r in report.results}
    assert ("moe-comm", "MoECommSettings", "settings-described") in rows
    assert {r.contract for r in report.results} == {"settings-model", "settings-described", "settings-names",
                                                   "settings-defaults", "settings-importable"}


def test_the_kit_names_each_broken_settings_contract(tmp_path, install):
    from ascend_kernel.conformance import run_conformance
    from ascend_kernel_plugins.moe_comm.settings import MoECommSettings as Builtin

    install({"tp_bad": BAD_PLUGIN}, dist="tp-bad")
    report = run_conformance(["tp-bad"], families=["settings"], cache_dir=tmp_path / "cache")
    failed = {r.contract: r.reason for r in report.failures}
    assert set(failed) == {"settings-described", "settings-names", "settings-importable"}
    assert "tpbad_window" in failed["settings-described"]
    assert "'tpbad_Mode' is not a lower-case identifier" in failed["settings-names"]
    assert "Hidden does not lead back to the class" in failed["settings-importable"]
    assert all(r.plugin == "tp-bad" and r.family == "settings" and r.implementation == "Hidden"
               for r in report.results)
    assert Builtin  # the built-ins' names are the ones a clash would be reported against


def test_the_kit_reports_a_name_clash_and_a_bad_default():
    from ascend_kernel.conformance.settings import check_settings

    class Clash(BaseModel):
        soc: str = Field("x", description="the core's name")
        mc2_min_world_size: int = Field(1, description="the moe-comm plugin's name")
        tp_limit: int = Field(-1, ge=0, description="a default its own bound refuses", validate_default=True)

    impl = type("Impl", (), {"function": staticmethod(lambda: Clash)})
    results = check_settings("tp", impl, "ep", declared_settings())
    (names,) = [r for r in results if r.contract == "settings-names"]
    assert names.status == "fail"
    assert "'soc' (ASCEND_KERNEL_SOC) is also declared by the core" in names.reason
    assert "'mc2_min_world_size' (ASCEND_KERNEL_MC2_MIN_WORLD_SIZE) is also declared by plugin 'moe-comm'" \
        in names.reason
    (defaults,) = [r for r in results if r.contract == "settings-defaults"]
    assert defaults.status == "fail" and "tp_limit" in defaults.reason


def test_a_bad_default_names_the_plugin_not_a_variable():
    class BadDefault(BaseModel):
        tp_limit: int = Field(-1, ge=0, description="a default its own bound refuses")

    with pytest.raises(SettingsError, match=r"the default of tp_limit \(declared by plugin 'tp'\), -1, is not "
                                            r"allowed: Input should be greater than or equal to 0"):
        load_settings(declared=[("tp", BadDefault)])


def test_a_settings_hook_that_raises_is_a_settings_error_naming_the_plugin(install):
    install({"tp_raising": """
        from ascend_kernel.hookspecs import hookimpl

        @hookimpl
        def ascend_kernel_settings():
            raise RuntimeError("no model today")
    """}, dist="tp-raising")
    with pytest.raises(SettingsError, match=r"ascend_kernel_settings of plugin 'tp-raising' \(.*\) raised "
                                            r"RuntimeError: no model today"):
        load_settings()

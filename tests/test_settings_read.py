"""No setting is accepted and ignored: each one of the composed model is read by the code, or refused when set.

The scan parses every module of ``ascend_kernel/`` and ``plugins/`` (not the
settings declarations, not the conformance kit, not the settings listing) and
collects the settings it reads: an attribute read on a settings object
(``settings.x``, ``ctx.settings.x``, ``self.kernel.settings.x``,
``load_settings().x``), a forcing name (``settings.forced("x")``), a
``getattr(settings, "x", ...)``, and the forcing settings of the kernel's
families (which the kernel reads through ``settings.forced(family.setting)``;
checked below too). A toggle declared with ``unimplemented_toggle`` is read by
``load_settings``, which refuses it when true; every such toggle is set here and
must be refused with the variable, the value, the feature and ``allowed: false``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from ascend_kernel.errors import SettingsError
from ascend_kernel.settings import KernelSettings, load_settings, settings_model, unimplemented_toggles

ROOT = Path(__file__).resolve().parents[1]
#: modules that declare or list settings, or check plugins (reading a setting there gives it no effect)
NOT_READERS = ("settings.py", "settings_doc.py", "conformance")


def _is_settings_expr(node: ast.AST) -> bool:
    """``settings``, ``x.settings``, ``self.kernel.settings``, ``load_settings()``, ``kernel_settings``..."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return "settings" in node.id
    if isinstance(node, ast.Attribute):
        return "settings" in node.attr
    return False


def _reads_in(tree: ast.AST) -> set[str]:
    reads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_settings_expr(node.value):
            reads.add(node.attr)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "forced" and _is_settings_expr(func.value):
                reads.add(str(node.args[0].value))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and _is_settings_expr(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            reads.add(str(node.args[1].value))
    return reads


def _reader_modules() -> list[Path]:
    files = [*sorted((ROOT / "ascend_kernel").rglob("*.py")), *sorted((ROOT / "plugins").rglob("*.py"))]
    return [f for f in files if not any(part in NOT_READERS for part in f.relative_to(ROOT).parts)]


def settings_read_by_code() -> dict[str, list[str]]:
    """Setting name -> the modules that read it."""
    where: dict[str, list[str]] = {}
    for path in _reader_modules():
        for name in _reads_in(ast.parse(path.read_text(), str(path))):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return where


def _family_forcing_settings() -> set[str]:
    from ascend_kernel.kernel import GLOBAL_FAMILIES, KV_CACHE_FAMILY, TABLE_FAMILIES

    return {f.setting for f in (*GLOBAL_FAMILIES, *TABLE_FAMILIES, KV_CACHE_FAMILY)}


def unread(model: type[KernelSettings]) -> list[str]:
    read = set(settings_read_by_code()) | _family_forcing_settings() | set(unimplemented_toggles(model))
    return sorted(name for name in model.model_fields if name not in read)


def test_every_setting_of_the_composed_model_is_read_or_refused():
    model = settings_model()
    assert model.declared, "the built-in plugins declare settings: the composed model must include them"
    assert set(model.owners) >= {"mc2_min_world_size", "graph_capture_sizes", "enable_topk_topp_optimization"}
    assert unread(model) == [], "settings accepted and read by nothing (read them, or declare them with "\
        "unimplemented_toggle so that setting them is refused)"


#: refused toggles that a consumer already reads, named with the reader: the input is wired ahead of the feature and
#: stays False until the feature's plugin declares the setting as a plain field (then this entry goes)
WIRED_AHEAD: dict[str, tuple[str, ...]] = {}  # (sequence_parallel left it: the tp-comm plugin declares and reads it)


def test_the_scan_finds_reads_of_every_kind_it_claims():
    """Not a tautology: known readers are found where they are, and a setting nobody reads is reported."""
    where = settings_read_by_code()
    assert "ascend_kernel/cli/liveness.py" in where["engine_liveness_timeout_s"]  # load_settings().x
    assert "plugins/kv_transfer/plugin.py" in where["kv_transfer_pull_timeout_s"]  # getattr(settings, "x", ...)
    assert "plugins/moe_comm/policy.py" in where["moe_comm_method"]  # ctx.settings.forced("x")
    assert "plugins/kv_cache/common.py" in where["kv_transfer_alignment_bytes"]  # settings.x
    # the TP-communication policy and the MoE policy both read the sequence-parallel switch
    assert {"plugins/tp_comm/plugin.py", "plugins/moe_comm/policy.py"} <= set(where["sequence_parallel"])
    for toggle in unimplemented_toggles(settings_model()):
        readers = set(where.get(toggle, ())) - set(WIRED_AHEAD.get(toggle, ()))
        assert not readers, f"{toggle} is read in {readers}: it is implemented, declare it as a plain field"

    class Ignored(BaseModel):
        demo_accepted_and_ignored: bool = Field(False, description="read by nothing")

    model = settings_model([*settings_model().declared, ("demo", Ignored)])
    assert unread(model) == ["demo_accepted_and_ignored"]


def test_the_kernel_reads_each_family_forcing_setting_through_forced():
    """The family table is counted as read because the kernel calls ``settings.forced(family.setting)``."""
    tree = ast.parse((ROOT / "ascend_kernel" / "kernel.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "forced" and n.args and isinstance(n.args[0], ast.Attribute)
             and n.args[0].attr == "setting"]
    assert len(calls) >= 2  # the global families' loop, the KV-cache family's


EXPECTED_TOGGLES = {
    "enable_dbo": "dual-batch overlap",
    "enable_prefetch_mlp": "MLP weight prefetch",
    "enable_fused_mc2": "fused MC2",
    "enable_mc2_hierarchy_comm": "hierarchical MC2",
}


def test_the_unimplemented_toggles_are_the_known_ones():
    toggles = unimplemented_toggles(settings_model())
    assert set(toggles) == set(EXPECTED_TOGGLES)
    for name, words in EXPECTED_TOGGLES.items():
        assert words in toggles[name]


@pytest.mark.parametrize("field", sorted(EXPECTED_TOGGLES))
@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_an_unimplemented_toggle_set_in_the_environment_is_refused(monkeypatch, field, value):
    env = KernelSettings.env_name(field)
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert f"{env}={value!r} is refused: " in msg and EXPECTED_TOGGLES[field] in msg
    assert "implemented by no installed plugin" in msg and msg.endswith("allowed: false.")


@pytest.mark.parametrize("field", sorted(EXPECTED_TOGGLES))
def test_an_unimplemented_toggle_in_additional_config_is_refused_and_false_is_accepted(monkeypatch, field):
    with pytest.raises(SettingsError, match=rf'additional_config\["ascend_kernel"\]\["{field}"\]=True is refused'):
        load_settings({"ascend_kernel": {field: True}})
    monkeypatch.setenv(KernelSettings.env_name(field), "0")
    assert getattr(load_settings({"ascend_kernel": {field: False}}), field) is False
    assert getattr(load_settings(), field) is False


def test_refusals_name_their_owner_and_come_together(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_DBO", "1")
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_FUSED_MC2", "yes")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_ENABLE_DBO='1' is refused" in msg and "declared by the core" in msg
    assert "ASCEND_KERNEL_ENABLE_FUSED_MC2='yes' is refused" in msg and "declared by plugin 'moe-comm'" in msg


def test_a_bad_value_of_a_toggle_is_still_a_type_error(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_PREFETCH_MLP", "maybe")
    with pytest.raises(SettingsError, match=r"ASCEND_KERNEL_ENABLE_PREFETCH_MLP='maybe' is not allowed"):
        load_settings()

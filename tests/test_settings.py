"""Settings: precedence, error messages, name lists, and where env/NPU access may live."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from ascend_kernel.errors import SettingsError
from ascend_kernel.settings import (
    ENV_PREFIX,
    KernelSettings,
    describe_settings,
    env_requests_kernel,
    load_settings,
    normalise_name,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


def ak(**values):
    return {"ascend_kernel": values}


# -- precedence ----------------------------------------------------------------


def test_defaults():
    s = load_settings()
    assert s.device == "auto"
    assert s.plugins is None
    assert s.disable_plugins == ()
    assert s.mc2_min_world_size == 16
    assert s.forced("sampler") is None


def test_env_overrides_default(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "cpu")
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "4")
    monkeypatch.setenv("ASCEND_KERNEL_TRACE_PLUGINS", "1")
    s = load_settings()
    assert (s.device, s.mc2_min_world_size, s.trace_plugins) == ("cpu", 4, True)


def test_additional_config_overrides_env(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "cpu")
    monkeypatch.setenv("ASCEND_KERNEL_SAMPLER", "from-env")
    monkeypatch.setenv("ASCEND_KERNEL_SOC", "A2")
    s = load_settings(ak(device="npu", sampler="From_Config"))
    assert s.device == "npu"
    assert s.sampler == "from-config"  # forced names are normalised
    assert s.forced("sampler") == "from-config"
    assert s.soc == "A2"  # not overridden: env still applies


def test_other_additional_config_keys_are_ignored():
    s = load_settings({"some_other_plugin": {"x": 1}, "ascend_kernel": {"soc": "A3"}})
    assert s.soc == "A3"
    assert load_settings({"unrelated": 1}).soc == "auto"


def test_additional_config_section_must_be_mapping():
    with pytest.raises(SettingsError, match=r'additional_config\["ascend_kernel"\].*mapping.*list'):
        load_settings({"ascend_kernel": ["device", "cpu"]})


def test_settings_are_frozen():
    s = load_settings()
    with pytest.raises(Exception):
        s.device = "cpu"  # type: ignore[misc]
    assert s.device == "auto"


# -- errors ----------------------------------------------------------------------


def test_bad_env_value_names_var_value_and_allowed(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "gpu")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_DEVICE" in msg
    assert "'gpu'" in msg
    for allowed in ("auto", "npu", "cpu"):
        assert f"'{allowed}'" in msg
    assert "additional_config" not in msg


def test_bad_env_int_names_bound(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "0")
    with pytest.raises(SettingsError, match=r"ASCEND_KERNEL_MC2_MIN_WORLD_SIZE='0'.*greater than or equal to 1"):
        load_settings()


def test_bad_env_bool(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_DBO", "maybe")
    with pytest.raises(SettingsError, match=r"ASCEND_KERNEL_ENABLE_DBO='maybe'"):
        load_settings()


def test_bad_additional_config_value_names_key():
    with pytest.raises(SettingsError) as info:
        load_settings(ak(soc="A9"))
    msg = str(info.value)
    assert 'additional_config["ascend_kernel"]["soc"]' in msg
    assert "'A9'" in msg
    assert "'A2'" in msg and "'A3'" in msg and "'310P'" in msg
    assert "ASCEND_KERNEL_SOC" not in msg


def test_bad_additional_config_value_wins_over_good_env(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "cpu")
    with pytest.raises(SettingsError, match=r'additional_config\["ascend_kernel"\]\["device"\]=\'tpu\''):
        load_settings(ak(device="tpu"))


def test_empty_forced_name_rejected():
    with pytest.raises(SettingsError, match=r'\["sampler"\].*non-empty'):
        load_settings(ak(sampler="  "))


def test_unknown_additional_config_key_lists_known_settings():
    with pytest.raises(SettingsError) as info:
        load_settings(ak(devcie="cpu"))
    msg = str(info.value)
    assert 'additional_config["ascend_kernel"]["devcie"]' in msg
    assert "unknown setting" in msg
    for name in KernelSettings.model_fields:
        assert name in msg


def test_several_problems_reported_at_once(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_SOC", "A1")
    with pytest.raises(SettingsError) as info:
        load_settings(ak(device="gpu"))
    msg = str(info.value)
    assert 'additional_config["ascend_kernel"]["device"]' in msg
    assert "ASCEND_KERNEL_SOC='A1'" in msg


def test_non_list_plugins_in_additional_config_is_settings_error():
    with pytest.raises(SettingsError, match=r'\["plugins"\]'):
        load_settings(ak(plugins=5))


def test_lowercase_env_var_value_is_named(monkeypatch):
    monkeypatch.setenv("ascend_kernel_device", "gpu")
    with pytest.raises(SettingsError, match="'gpu'"):
        load_settings()


# -- name lists ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("moe_comm", ("moe-comm",)),
        (" Moe_Comm , ,SPEC_DECODE_NGRAM,", ("moe-comm", "spec-decode-ngram")),
        ("a,B-c,d_E", ("a", "b-c", "d-e")),
        ("", ()),
    ],
)
def test_env_name_lists_normalise(monkeypatch, raw, expected):
    monkeypatch.setenv("ASCEND_KERNEL_PLUGINS", raw)
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", raw)
    s = load_settings()
    assert s.plugins == expected
    assert s.disable_plugins == expected


def test_additional_config_name_lists_accept_lists_and_strings():
    s = load_settings(ak(plugins=["Sampling", " kv_cache_standard "], disable_plugins="MOE_COMM"))
    assert s.plugins == ("sampling", "kv-cache-standard")
    assert s.disable_plugins == ("moe-comm",)


def test_normalise_name():
    assert normalise_name("  Spec_Decode_NGRAM ") == "spec-decode-ngram"


def test_env_requests_kernel(monkeypatch):
    assert env_requests_kernel() is False
    monkeypatch.setenv("ASCEND_KERNEL_SOC", "A2")
    assert env_requests_kernel() is True


# -- describe_settings ------------------------------------------------------------


def test_describe_settings_lists_every_field_with_env_name():
    rows = describe_settings()
    assert [r["name"] for r in rows] == list(KernelSettings.model_fields)
    for row in rows:
        assert row["env"] == "ASCEND_KERNEL_" + row["name"].upper()
        assert row["description"], row["name"]
        assert row["value"] is None
    by_name = {r["name"]: r for r in rows}
    assert by_name["mc2_min_world_size"]["default"] == 16
    assert by_name["device"]["default"] == "auto"


def test_describe_settings_with_values(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "moe_comm")
    rows = {r["name"]: r for r in describe_settings(load_settings(ak(soc="A3")))}
    assert rows["soc"]["value"] == "A3"
    assert rows["disable_plugins"]["value"] == ("moe-comm",)
    assert rows["device"]["value"] == "auto"


# -- source rules ------------------------------------------------------------------


def _python_files():
    for top in ("ascend_kernel", "plugins"):
        yield from sorted((REPO / top).rglob("*.py"))


def _env_reads(tree: ast.AST) -> list[int]:
    """Lines that read the environment: os.getenv(...), getenv imported from os, os.environ.get / [...]."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "getenv" and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("getenv", "environ") for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _is_os_environ(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_os_environ(node.value):
            lines.append(node.lineno)
    return lines


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _npu_uses(tree: ast.AST) -> list[int]:
    """Lines that import or touch torch_npu / torch.npu (strings and docstrings do not count)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch_npu" or a.name.startswith("torch.npu")
                                                for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.split(".")[0] == "torch_npu" or node.module.startswith("torch.npu")
                or (node.module == "torch" and any(a.name == "npu" for a in node.names))):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "torch_npu":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "npu" and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).split(".")[0] == "torch_npu":
            lines.append(node.lineno)
    return lines


def test_only_settings_reads_the_environment():
    offenders = []
    for path in _python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == "ascend_kernel/settings.py":
            continue
        text = path.read_text()
        if "os.getenv" in text:  # even in a comment: the rule is "nothing else calls os.getenv"
            offenders.append(f"{rel}: mentions os.getenv")
        offenders += [f"{rel}:{line}" for line in _env_reads(ast.parse(text))]
    assert offenders == []


def test_only_the_device_seam_touches_torch_npu():
    offenders = []
    for path in _python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == "ascend_kernel/device.py" or "ops" in path.relative_to(REPO).parts[:-1]:
            continue
        offenders += [f"{rel}:{line}" for line in _npu_uses(ast.parse(path.read_text()))]
    assert offenders == []


def test_source_rule_checkers_detect_violations():
    """The checkers above must be able to fail."""
    bad_env = "import os\nx = os.getenv('A')\ny = os.environ.get('B')\nz = os.environ['C']\nos.environ['D'] = '1'\n"
    assert sorted(_env_reads(ast.parse(bad_env))) == [2, 3, 4]
    bad_npu = "import torch_npu\nimport torch\nfrom torch_npu.npu import x\ny = torch.npu.Stream()\n'torch_npu in a string'\n"
    assert sorted(set(_npu_uses(ast.parse(bad_npu)))) == [1, 3, 4]
    device_src = (REPO / "ascend_kernel/device.py").read_text()
    assert _npu_uses(ast.parse(device_src))  # the seam itself really is detected

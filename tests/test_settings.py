"""Settings: precedence, error messages, name lists, and where env/NPU access may live."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_kernel.errors import SettingsError
from ascend_kernel.cli.settings_doc import describe_settings
from ascend_kernel.settings import (
    ENV_PREFIX,
    LIST_SETTINGS,
    KernelSettings,
    env_requests_kernel,
    load_settings,
    normalise_name,
    settings_model,
)

REPO = Path(__file__).resolve().parents[1]
#: every setting of this installation: the core's (KernelSettings) and the built-in plugins'
ALL_FIELDS = settings_model().model_fields


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


def test_messages_name_the_key_the_user_wrote_additional_config_or_variable(monkeypatch):
    """A forced name from additional_config is named by its key there, not by the variable nobody set (the
    selection error for a cpu-graph asked for in additional_config said "forced by ASCEND_KERNEL_GRAPH_MODE")."""
    import pickle

    from ascend_kernel.errors import SelectionError
    from ascend_kernel.kernel import build_kernel

    monkeypatch.setenv("ASCEND_KERNEL_SAMPLER", "fast-cpu")
    s = load_settings({**ak(graph_mode="cpu-graph", kv_cache_layout="no-such-layout"), "enable_flashcomm1": True})
    assert s.source_name("graph_mode") == 'additional_config["ascend_kernel"]["graph_mode"]'
    assert s.source_name("sampler") == "ASCEND_KERNEL_SAMPLER"  # from the environment
    assert s.source_name("layer_ops") == "ASCEND_KERNEL_LAYER_OPS"  # its default: the variable to set
    assert pickle.loads(pickle.dumps(s)).source_name("graph_mode") == s.source_name("graph_mode")  # to the workers
    with pytest.raises(SelectionError, match=r'forced by additional_config\["ascend_kernel"\]\["kv_cache_layout"\]'):
        build_kernel(s, "cpu")._check_forced_kv_layout_name()


def test_other_additional_config_keys_are_left_to_the_plugins():
    """The core reads its own section only; the vllm-ascend-keys plugin refuses a key nobody knows."""
    s = load_settings({"some_other_plugin": {"x": 1}, "ascend_kernel": {"soc": "A3"}}, declared=[])
    assert s.soc == "A3"
    with pytest.raises(SettingsError, match=r'additional_config\["unrelated"\]=1 is no key of vllm-ascend'):
        load_settings({"unrelated": 1})


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
    for name in ALL_FIELDS:
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


# -- unknown and empty variables ---------------------------------------------------


def test_unknown_env_var_is_an_error_with_the_closest_name(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_SAMPLR", "foo")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_SAMPLR='foo' is not a setting" in msg
    assert "did you mean ASCEND_KERNEL_SAMPLER?" in msg
    assert "`ascend-kernel settings` lists every setting" in msg


def test_unknown_lowercase_env_var_is_named_as_spelled(monkeypatch):
    monkeypatch.setenv("ascend_kernel_disable_plugin", "moe_comm")
    with pytest.raises(SettingsError, match=r"ascend_kernel_disable_plugin='moe_comm' is not a setting "
                                            r"\(did you mean ASCEND_KERNEL_DISABLE_PLUGINS\?\)"):
        load_settings()


def test_unknown_env_var_without_a_close_name(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_XYZZY", "1")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "ASCEND_KERNEL_XYZZY='1' is not a setting;" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_unknown_env_var_is_reported_even_when_additional_config_is_used(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVCIE", "cpu")
    with pytest.raises(SettingsError, match="did you mean ASCEND_KERNEL_DEVICE"):
        load_settings(ak(device="cpu"))


def test_unknown_additional_config_key_suggests_the_closest():
    with pytest.raises(SettingsError, match=r'\["samplr"\] \(did you mean \'sampler\'\?\)'):
        load_settings(ak(samplr="x"))


NON_LIST_SETTINGS = [f for f in ALL_FIELDS if f not in LIST_SETTINGS]


@pytest.mark.parametrize("field", NON_LIST_SETTINGS)
@pytest.mark.parametrize("empty", ["", "  "])
def test_empty_env_value_is_an_error_naming_what_is_allowed(monkeypatch, field, empty):
    var = KernelSettings.env_name(field)
    monkeypatch.setenv(var, empty)
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert f"{var} is set but empty; allowed: " in msg
    assert msg.count(var) == 1  # pydantic's own error for the same variable is not repeated
    assert f"(default {ALL_FIELDS[field].default!r})" in msg


def test_empty_device_names_the_choices(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value) == ("Invalid ascend-kernel setting: ASCEND_KERNEL_DEVICE is set but empty; "
                               "allowed: one of 'auto', 'npu', 'cpu' (default 'auto').")


@pytest.mark.parametrize(("field", "allowed"), [
    ("enable_dbo", "true or false"),
    ("mc2_min_world_size", "a whole number >= 1"),
    ("sampler", "'auto' or a non-empty implementation name"),
    ("soc", "one of 'auto', 'A2', 'A3', '310P'"),
])
def test_empty_value_allowed_words(monkeypatch, field, allowed):
    monkeypatch.setenv(KernelSettings.env_name(field), "")
    with pytest.raises(SettingsError, match=f"allowed: {allowed}"):
        load_settings()


@pytest.mark.parametrize("field", LIST_SETTINGS)
def test_empty_list_setting_means_empty_list(monkeypatch, field):
    monkeypatch.setenv(KernelSettings.env_name(field), "")
    assert getattr(load_settings(), field) == ()


def test_empty_additional_config_value_is_an_error():
    with pytest.raises(SettingsError, match=r'additional_config\["ascend_kernel"\]\["soc"\] is set but empty; '
                                            r"allowed: one of 'auto', 'A2', 'A3', '310P'"):
        load_settings(ak(soc=""))


def test_empty_env_value_overridden_by_additional_config_is_not_used(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "")
    assert load_settings(ak(device="cpu")).device == "cpu"


def test_bad_bool_and_int_name_what_is_allowed(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_DBO", "maybe")
    monkeypatch.setenv("ASCEND_KERNEL_MC2_MIN_WORLD_SIZE", "many")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_ENABLE_DBO='maybe' is not allowed" in msg and "allowed: true or false" in msg
    assert "ASCEND_KERNEL_MC2_MIN_WORLD_SIZE='many' is not allowed" in msg and "allowed: a whole number >= 1" in msg


def test_unknown_empty_and_bad_reported_together(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_SAMPLR", "foo")
    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "")
    monkeypatch.setenv("ASCEND_KERNEL_SOC", "A9")
    with pytest.raises(SettingsError) as info:
        load_settings()
    msg = str(info.value)
    assert "ASCEND_KERNEL_SAMPLR='foo'" in msg and "ASCEND_KERNEL_DEVICE is set but empty" in msg
    assert "ASCEND_KERNEL_SOC='A9'" in msg
    assert "\n" not in msg


# -- the error through vLLM's platform detection and config ---------------------------


def test_settings_error_is_not_a_value_error(monkeypatch):
    """pydantic (VllmConfig is a pydantic dataclass) rewraps ValueErrors raised while it builds one."""
    assert not issubclass(SettingsError, ValueError)
    from pydantic.dataclasses import dataclass

    @dataclass
    class Config:
        x: int = 0

        def __post_init__(self):
            load_settings()

    monkeypatch.setenv("ASCEND_KERNEL_SAMPLR", "foo")
    with pytest.raises(SettingsError, match="did you mean ASCEND_KERNEL_SAMPLER"):
        Config()


@pytest.mark.parametrize(("var", "value"), [("ASCEND_KERNEL_SAMPLR", "foo"), ("ASCEND_KERNEL_DEVICE", "")])
def test_register_activates_the_kernel_on_a_bad_variable(monkeypatch, caplog, var, value):
    """vLLM swallows errors in platform detection: register() must not raise, and must not stay off."""
    from ascend_kernel import CPU_PLATFORM, register

    monkeypatch.setenv(var, value)
    assert register() == CPU_PLATFORM
    assert var in caplog.text


@pytest.mark.parametrize("npu_visible", [True, False])
def test_a_refused_vllm_ascend_variable_does_not_switch_the_kernel_off_on_an_npu_host(monkeypatch, caplog,
                                                                                       npu_visible):
    """On an NPU host a refused ``VLLM_ASCEND_*`` variable still selects the NPU platform (whose config check then
    raises the refusal); on a host without one and no ``ASCEND_KERNEL_*`` variable the kernel stays off."""
    import ascend_kernel.device
    from ascend_kernel import NPU_PLATFORM, register

    for key in [k for k in os.environ if k.upper().startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(ascend_kernel.device, "npu_available", lambda: npu_visible)  # the host's NPU detection
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_MLAPO", "1")
    assert register() == (NPU_PLATFORM if npu_visible else None)
    assert "VLLM_ASCEND_ENABLE_MLAPO='1' is refused" in caplog.text


def test_vllm_config_reports_the_settings_error_itself(tmp_path):
    """Through vLLM: platform detection, then VllmConfig's platform check raises the kernel's error (no engine)."""
    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("llama", tmp_path / "llama")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    env.update(ASCEND_KERNEL_SAMPLR="foo", ASCEND_KERNEL_DEVICE="", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    code = ("import sys; from vllm.engine.arg_utils import EngineArgs; "
            "EngineArgs(model=sys.argv[1], dtype='float32', max_model_len=64).create_engine_config()")
    proc = subprocess.run([sys.executable, "-c", code, str(model)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ascend_kernel.errors.SettingsError: Invalid ascend-kernel setting:"), proc.stderr[-3000:]
    assert "ASCEND_KERNEL_SAMPLR='foo' is not a setting (did you mean ASCEND_KERNEL_SAMPLER?)" in last
    assert "ASCEND_KERNEL_DEVICE is set but empty; allowed: one of 'auto', 'npu', 'cpu'" in last
    assert "validation error for VllmConfig" not in proc.stderr


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
    assert sorted(r["name"] for r in rows) == sorted(ALL_FIELDS)
    assert [r["name"] for r in rows][:len(KernelSettings.model_fields)] == list(KernelSettings.model_fields)
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

"""The CLI commands that need no engine: plugins, settings, error paragraphs."""

from __future__ import annotations

import json

import pytest

from ascend_kernel.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plugins_json_lists_separate_builtins(capsys):
    rc, out, _ = run(capsys, "plugins", "--json")
    assert rc == 0
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    builtins = [p for p in plugins.values() if p["builtin"]]
    assert len(builtins) >= 6
    assert all(p["status"] == "loaded" and p["entry_point"].startswith("ascend_kernel.plugins: ") for p in builtins)
    assert "sampler:vllm-default" in plugins["sampling"]["implementations"]
    assert "ascend_kernel_samplers" in plugins["sampling"]["hooks"]
    assert plugins["sampling"]["essential"]
    # every family has at least one built-in implementation
    families = {impl.split(":")[0] for p in builtins for impl in p["implementations"]}
    assert families == {"attention_backend", "attention_state", "attention_mask", "moe_comm", "drafter", "sampler",
                        "rejection_sampler", "graph", "layer_ops", "kv_cache"}


def test_disabled_plugin_shows_and_loses_its_implementations(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "spec_decode_ngram")
    rc, out, _ = run(capsys, "plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert plugins["spec-decode-ngram"]["status"] == "disabled"
    assert plugins["spec-decode-ngram"]["implementations"] == []


def test_settings_json_has_type_default_env_value(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_MOE_COMM", "Ascend")
    rc, out, _ = run(capsys, "settings", "--json")
    rows = {r["name"]: r for r in json.loads(out)["settings"]}
    assert rows["moe_comm"] == {**rows["moe_comm"], "env": "ASCEND_KERNEL_MOE_COMM", "value": "ascend", "default": "auto"}
    assert rows["device"]["type"].startswith("Literal")
    assert rows["mc2_min_world_size"]["default"] == 16


@pytest.mark.parametrize("command", ["plugins", "settings"])
def test_bad_value_is_one_paragraph_exit_2(capsys, monkeypatch, command):
    monkeypatch.setenv("ASCEND_KERNEL_ENABLE_DBO", "perhaps")
    rc, out, err = run(capsys, command)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "ASCEND_KERNEL_ENABLE_DBO='perhaps'" in err and "bool" in err


def test_essential_plugin_refuses_to_be_disabled(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "sampling")
    rc, _, err = run(capsys, "plugins")
    assert rc == 2
    assert "'sampling'" in err and "essential" in err and "ascend_kernel_plugins.sampling.plugin" in err

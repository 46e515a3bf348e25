"""The CLI commands that need no engine: plugins, settings, error paragraphs, bad command-line values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_kernel.cli.main import main
from ascend_kernel.settings import ENV_PREFIX

REPO = Path(__file__).resolve().parents[1]


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
    assert families == {"attention_backend", "attention_state", "attention_mask", "moe_comm", "moe_comm_method",
                        "drafter", "sampler", "quantization",
                        "rejection_sampler", "graph", "layer_ops", "kv_cache", "fusion_pass", "tp_comm"}


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
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "ASCEND_KERNEL_ENABLE_DBO='perhaps'" in err and "bool" in err
    if command == "plugins":
        assert out == ""
    else:  # the settings errors point here, so it still lists every setting (no values: they are invalid)
        assert "ASCEND_KERNEL_ENABLE_DBO" in out and "ASCEND_KERNEL_SAMPLER" in out


def test_settings_lists_everything_despite_an_unknown_variable(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_SAMPLR", "foo")
    rc, out, err = run(capsys, "settings", "--json")
    assert rc == 2
    payload = json.loads(out)
    assert {r["env"] for r in payload["settings"]} >= {"ASCEND_KERNEL_SAMPLER", "ASCEND_KERNEL_DEVICE"}
    assert "did you mean ASCEND_KERNEL_SAMPLER?" in payload["error"]
    assert err.count("\n") == 1 and "ASCEND_KERNEL_SAMPLR='foo' is not a setting" in err


def test_essential_plugin_refuses_to_be_disabled(capsys, monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_DISABLE_PLUGINS", "sampling")
    rc, _, err = run(capsys, "plugins")
    assert rc == 2
    assert "'sampling'" in err and "essential" in err and "ascend_kernel_plugins.sampling.plugin" in err


# -- bad command-line values: one paragraph, exit 2, no traceback, no engine ------------------


def cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    clean.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, **env)
    return subprocess.run([sys.executable, "-m", "ascend_kernel.cli.main", *argv], cwd=REPO, env=clean,
                          capture_output=True, text=True, timeout=300)


def engine_cli(*argv: str) -> subprocess.CompletedProcess:
    """A command refused after vLLM is imported (for its types), in a process forked from the test zygote that
    imported it once (tests/e2e/cli_zygote.py): the same argv, environment and exit status, without ~15 s of
    imports per command."""
    from tests.e2e.conftest import clean_env, run_cli

    return run_cli(list(argv), env=clean_env(), expect_rc=2)


def error_line(proc: subprocess.CompletedProcess, *needles: str, alone: bool = True) -> str:
    """The error paragraph (the last stderr line; with alone, the only one), checked for rc 2 and needles."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    if alone:
        assert len(lines) == 1, proc.stderr
    line = lines[-1]
    assert line.startswith("ascend-kernel"), line
    for needle in needles:
        assert needle in line
    return line


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Enough of a model directory for the checks that come before vLLM reads it."""
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text("{}")
    return str(path)


def test_engine_arg_of_the_wrong_type_is_refused_before_the_engine(model_dir):
    proc = engine_cli("generate", "--model", model_dir, "--engine-arg", "max_num_seqs=abc")
    # not alone: importing vLLM (for its types) logs to stderr
    error_line(proc, "--engine-arg max_num_seqs='abc' is not allowed", "whole number", alone=False)
    assert "Resolved architecture" not in proc.stderr  # vLLM never read the model


@pytest.mark.parametrize(("argv", "needles"), [
    (["--max-tokens", "-5"], ["argument --max-tokens: '-5' is not allowed; give a whole number >= 1"]),
    (["--max-tokens", "many"], ["argument --max-tokens: 'many'", ">= 1"]),
    (["--max-model-len", "0"], ["argument --max-model-len: '0'", ">= 1"]),
    (["--seed", "-1"], ["argument --seed: '-1'", "from 0 to 4294967295"]),
    (["--speculative-config", "{bad"], ["argument --speculative-config: '{bad' is not valid JSON", "JSON object"]),
    (["--speculative-config", "[1]"], ["argument --speculative-config: '[1]' is a JSON list", "JSON object"]),
    (["--additional-config", "5"], ["argument --additional-config: '5' is a number", "JSON object"]),
    (["--engine-arg", "max_num_seqs"], ["argument --engine-arg: 'max_num_seqs' must look like KEY=VALUE"]),
    (["--prompt"], ["argument --prompt: expected one argument"]),
    (["--lora", "adapter-dir"], ["argument --lora: 'adapter-dir': give NAME=PATH"]),
    (["--lora", "a=/no/such/adapter"], ["argument --lora: 'a=/no/such/adapter'", "not a PEFT adapter directory"]),
])
def test_bad_flag_value_names_flag_value_and_allowed(model_dir, argv, needles):
    error_line(cli("generate", "--model", model_dir, *argv), *needles, "(see: ascend-kernel generate --help)")


def test_lora_adapters_need_names_of_their_own(model_dir, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    proc = engine_cli("generate", "--model", model_dir, "--lora", f"a={tmp_path}", "--lora", f"a={tmp_path}")
    error_line(proc, "--lora names ['a', 'a']: each adapter needs a name of its own", alone=False)
    assert "Resolved architecture" not in proc.stderr  # refused before vLLM read the model


def test_model_that_is_missing_or_no_model(tmp_path):
    error_line(cli("explain", "--model", str(tmp_path / "nope")),
               f"argument --model: '{tmp_path / 'nope'}' does not exist", "ascend-kernel tiny-model")
    error_line(cli("generate", "--model", str(tmp_path)), f"argument --model: '{tmp_path}' holds no config.json")
    error_line(cli("generate"), "the following arguments are required: --model")


def test_tiny_model_bad_arch_and_foreign_out_dir(tmp_path):
    error_line(cli("tiny-model", "--arch", "gpt5", "--out", str(tmp_path / "m")),
               "argument --arch: invalid choice: 'gpt5'", "'llama'")
    (tmp_path / "mine.txt").write_text("not a model")
    error_line(cli("tiny-model", "--out", str(tmp_path)), f"--out '{tmp_path}'", "refusing to overwrite")


# -- the --engine-arg checker against vLLM's own annotations (in process, no engine) -----------


@pytest.fixture(scope="module")
def vllm_types():
    from ascend_kernel.cli.engine_args import keyword_types

    return keyword_types()


def check_one(vllm_types, key: str, text: str):
    from ascend_kernel.cli.engine_args import Given, check, decode

    return check({key: Given(f"--engine-arg {key}={text!r}", decode(text), text)}, vllm_types)[key]


@pytest.mark.parametrize(("key", "text", "expected"), [
    ("max_num_seqs", "4", 4),
    ("max_num_seqs", "null", None),
    ("enable_chunked_prefill", "false", False),
    ("enforce_eager", "True", True),
    ("gpu_memory_utilization", "1", 1.0),
    ("kv_cache_dtype", "int8_per_token_head", "int8_per_token_head"),
    ("revision", "1234", "1234"),  # a string keyword takes the text, not the JSON number
    ("block_size", "16", 16),
    ("offload_params", '["a"]', {"a"}),
    ("compilation_config", '{"custom_ops": ["all"]}', {"custom_ops": ["all"]}),
    ("attention_config", '{"backend": "CPU_MLA"}', {"backend": "CPU_MLA"}),
    ("speculative_config", '{"method": "ngram"}', {"method": "ngram"}),
    ("tokenizer_mode", "custom", "custom"),  # Literal[...] | str
])
def test_engine_arg_accepted(vllm_types, key, text, expected):
    value = check_one(vllm_types, key, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(("key", "text", "needles"), [
    ("max_num_seqs", "abc", ["vLLM's max_num_seqs takes a whole number or null"]),
    ("max_num_seqs", "2.5", ["whole number"]),
    ("enforce_eager", "maybe", ["vLLM's enforce_eager takes true or false"]),
    ("gpu_memory_utilization", "lots", ["takes a number"]),
    ("kv_cache_dtype", "int9", ["one of 'auto'", "'int8_per_token_head'"]),
    ("dtype", "float99", ["one of 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32'"]),
    ("speculative_config", "3", ["takes a JSON object or null"]),
    ("compilation_config", '{"custom_op": ["all"]}', ["CompilationConfig has no field 'custom_op'",
                                                     "did you mean 'custom_ops'?"]),
    ("max_num_seq", "3", ["vLLM has no engine argument 'max_num_seq' (did you mean max_num_seqs?)"]),
])
def test_engine_arg_refused_with_what_is_allowed(vllm_types, key, text, needles):
    from ascend_kernel.errors import UsageError

    with pytest.raises(UsageError) as info:
        check_one(vllm_types, key, text)
    msg = str(info.value)
    assert msg.startswith(f"--engine-arg {key}={text!r} is not allowed: ")
    for needle in needles:
        assert needle in msg


def test_engine_arg_problems_are_reported_together(vllm_types):
    from ascend_kernel.cli.engine_args import Given, check
    from ascend_kernel.errors import UsageError

    with pytest.raises(UsageError) as info:
        check({"max_num_seqs": Given("--engine-arg max_num_seqs='x'", "x", "x"),
               "dtype": Given("--dtype 'f99'", "f99", "f99"),
               "block_size": Given("--engine-arg block_size=16", 16, "16")}, vllm_types)
    msg = str(info.value)
    assert "--engine-arg max_num_seqs='x'" in msg and "--dtype 'f99'" in msg and "block_size" not in msg


def test_vllm_config_validation_error_is_one_line():
    """What vLLM's own config validation refuses (max_num_seqs=0) is printed as one line, not pydantic's block."""
    from pydantic import BaseModel, Field

    from ascend_kernel.cli.main import _one_paragraph

    class SchedulerConfig(BaseModel):
        max_num_seqs: int = Field(1, ge=1)
        policy: str = "fcfs"

    with pytest.raises(ValueError) as info:
        SchedulerConfig(max_num_seqs=0, policy=["x"])
    assert _one_paragraph(info.value) == ("vLLM refused the SchedulerConfig: max_num_seqs: Input should be greater "
                                          "than or equal to 1 (given 0); policy: Input should be a valid string")

"""Every command of ``ascend-kernel`` refuses bad arguments the same way, whatever the value.

Hypothesis draws bad values for each command's arguments (and bad
``ASCEND_KERNEL_*`` variables for the commands that read settings). Each one
must end with exit status 2 and one paragraph on stderr that names the
argument and says what is allowed, never a traceback, and before any engine
starts. The CLI runs in this process through ``main([...])``; building an
engine is patched to fail the test, so a value that slipped past the checks
is caught instead of starting vLLM.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import string
from typing import Any, Literal, Union, get_args, get_origin
from unittest import mock

import pytest
from fuzzing import fuzz
from hypothesis import HealthCheck, assume, example, given
from hypothesis import strategies as st

from ascend_kernel.cli.main import build_parser, main
from ascend_kernel.settings import ENV_PREFIX, KernelSettings, load_settings, settings_model

#: every setting: the core's and the built-in plugins' (ascend_kernel_settings)
ALL_FIELDS = settings_model().model_fields

FUZZ = fuzz(40, suppress_health_check=[HealthCheck.too_slow])
#: any text a command line can carry (argv strings cannot hold NUL; undecodable bytes arrive as surrogates)
ARG_TEXT = st.text(st.characters(blacklist_characters="\0"), max_size=20)
#: what an environment variable can hold
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
SEED_MAX = 2**32 - 1


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``main(argv)`` in this process with only ``env``'s ASCEND_KERNEL_* variables: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.upper().startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                mock.patch("ascend_kernel.cli.engine.build_llm", side_effect=AssertionError("an engine would start")):
            try:
                status = main(argv)
            except SystemExit as exc:
                status = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return status, out.getvalue(), err.getvalue()


def refused(argv: list[str], *needles: str, env: dict[str, str] | None = None) -> str:
    """The one-paragraph refusal of ``argv``, checked to hold every needle."""
    status, out, err = run(argv, env)
    assert status == 2, (argv, status, err)
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1 and "\r" not in err, err
    assert err.startswith("ascend-kernel"), err
    flat = " ".join(err.split())  # error paragraphs fold runs of spaces, also inside quoted values
    for needle in needles:
        assert " ".join(needle.split()) in flat, (needle, err)
    if argv[0] != "settings":  # settings still lists every setting when a variable is bad
        assert out == "", out
    return err


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def bad_whole_number(minimum: int, maximum: int | None = None) -> st.SearchStrategy[str]:
    """Text that is no whole number from ``minimum`` to ``maximum``."""
    out_of_range = st.integers(max_value=minimum - 1)
    if maximum is not None:
        out_of_range = out_of_range | st.integers(min_value=maximum + 1)
    return ARG_TEXT.filter(lambda t: _int_or_none(t) is None) | out_of_range.map(str) \
        | st.floats(allow_nan=True).map(repr)


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd(tmp_path_factory):
    """Commands run in an empty directory: a check that ever let a relative --out through writes nothing here."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Enough of a model directory for every check that comes before vLLM reads it."""
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text("{}")
    return str(path)


@pytest.fixture(scope="module")
def taken(tmp_path_factory) -> dict[str, str]:
    """Paths --out must refuse: a file, and a directory that holds something else."""
    base = tmp_path_factory.mktemp("taken")
    (base / "a-file").write_text("not a model")
    (base / "a-dir").mkdir()
    (base / "a-dir" / "notes.txt").write_text("not a model")
    return {"file": str(base / "a-file"), "dir": str(base / "a-dir")}


@pytest.fixture(scope="module", autouse=True)
def vllm_types() -> dict[str, Any]:
    """vLLM's keyword types, imported (platform included) with no ASCEND_KERNEL_* set, before any command runs.

    vLLM fixes its platform when first asked in a process. Asked here, with a
    clean environment, it is the stock CPU platform, as every other in-process
    test sees it; otherwise the first command to reach vLLM's types would ask
    after the CLI has set ASCEND_KERNEL_DEVICE=cpu, pinning the kernel's
    platform for the rest of the test session.
    """
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.upper().startswith(ENV_PREFIX)]:
            del os.environ[key]
        import vllm.platforms

        from ascend_kernel.cli.engine_args import keyword_types

        vllm.platforms.current_platform.device_type  # noqa: B018 - resolves the platform now
        return keyword_types()
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -- commands and their options -------------------------------------------------------------------


def _options(command: str) -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return [s for a in sub._actions for s in a.option_strings]


#: the arguments each command needs to get past argparse's required-argument check
REQUIRED = {"plugins": [], "settings": [], "tiny-model": ["--out", "{new}"], "real-model": [], "conformance": [],
            "explain": ["--model", "{model}"], "generate": ["--model", "{model}"]}


def _required(command: str, model_dir: str, tmp: str) -> list[str]:
    return [a.format(model=model_dir, new=os.path.join(tmp, "never-written")) for a in REQUIRED[command]]


@FUZZ
@given(command=st.sampled_from(sorted(REQUIRED)), data=st.data())
def test_unknown_option_or_extra_argument(model_dir, tmp_path_factory, command, data):
    options = _options(command)
    word = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
    # argparse takes unambiguous prefixes of an option, so nothing that starts one
    unknown = word.map(lambda w: "--" + w).filter(lambda o: not any(s.startswith(o.split("=")[0])
                                                                     for s in options))
    extra = data.draw(unknown | ARG_TEXT.filter(lambda t: t and not t.startswith("-")), label="extra")
    argv = [command, *_required(command, model_dir, str(tmp_path_factory.getbasetemp())), extra]
    err = refused(argv, "unrecognized arguments", repr(extra).replace("\n", " "), f"ascend-kernel {command} takes")
    assert "--json" in err


@FUZZ
@given(command=ARG_TEXT.filter(lambda c: c not in REQUIRED and c not in ("serve", "pd-proxy", "serve-pd") and not c.startswith("-")))
def test_unknown_command(command):
    refused([command], "argument command: invalid choice", "choose from", "'generate'", "'real-model'")


# -- numbers and JSON ----------------------------------------------------------------------------

NUMBER_FLAGS = [("generate", "--max-tokens", 1, None), ("generate", "--max-model-len", 1, None),
                ("generate", "--seed", 0, SEED_MAX), ("explain", "--max-model-len", 1, None),
                ("explain", "--seed", 0, SEED_MAX), ("tiny-model", "--seed", 0, SEED_MAX)]


@FUZZ
@given(case=st.sampled_from(NUMBER_FLAGS), data=st.data())
def test_bad_whole_numbers(model_dir, tmp_path_factory, case, data):
    command, flag, minimum, maximum = case
    value = data.draw(bad_whole_number(minimum, maximum), label="value")
    argv = [command, *_required(command, model_dir, str(tmp_path_factory.getbasetemp())), f"{flag}={value}"]
    allowed = f"a whole number >= {minimum}" if maximum is None else f"a whole number from {minimum} to {maximum}"
    refused(argv, f"argument {flag}: {value!r} is not allowed", allowed)


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | ARG_TEXT,
                           lambda inner: st.lists(inner, max_size=3), max_leaves=5)


@FUZZ
@given(command=st.sampled_from(["generate", "explain"]), flag=st.sampled_from(["--additional-config",
                                                                                "--speculative-config"]),
       value=ARG_TEXT.filter(lambda t: not _json_object(t)) | JSON_VALUES.map(json.dumps))
def test_json_flag_that_is_no_object(model_dir, command, flag, value):
    refused([command, "--model", model_dir, f"{flag}={value}"], f"argument {flag}: {value!r}", "give a JSON object")


IDENTIFIER = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)


@FUZZ
@given(key=IDENTIFIER, value=JSON_VALUES)
def test_speculative_config_key_vllm_does_not_have(model_dir, vllm_types, key, value):
    from vllm.config import SpeculativeConfig

    assume(key not in SpeculativeConfig.__pydantic_fields__)
    text = json.dumps({key: value})
    refused(["generate", "--model", model_dir, "--speculative-config", text],
            f"--speculative-config {text!r} is not allowed", f"SpeculativeConfig has no field {key!r}")


@FUZZ
@given(key=IDENTIFIER, value=JSON_VALUES)
def test_additional_config_setting_the_kernel_does_not_have(model_dir, vllm_types, key, value):
    assume(key not in ALL_FIELDS)
    refused(["explain", "--model", model_dir, "--additional-config", json.dumps({"ascend_kernel": {key: value}})],
            f'unknown setting additional_config["ascend_kernel"]["{key}"]', "known settings: ")


# -- --engine-arg and --dtype against vLLM's own types --------------------------------------------


def _plain(tp: Any) -> tuple[Any, bool]:
    """(the annotation without Annotated bounds and None, whether None is allowed)."""
    if get_origin(tp) is not None and getattr(tp, "__metadata__", None) is not None:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, type(int | None)):
        members = [a for a in get_args(tp) if a is not type(None)]
        return (members[0] if len(members) == 1 else tp), len(members) < len(get_args(tp))
    return tp, False


def _decoded(text: str) -> Any:
    from ascend_kernel.cli.engine_args import decode

    return decode(text)


def _not_a(kind: type, text: str, nullable: bool) -> bool:
    value = _decoded(text)
    if value is None:
        return not nullable
    if kind is bool:
        return not isinstance(value, bool) and not (isinstance(value, str) and value.lower() in ("true", "false"))
    if kind is int:
        return not isinstance(value, int) or isinstance(value, bool)
    return not isinstance(value, (int, float)) or isinstance(value, bool)  # float


def _bad_engine_arg(vllm_types: dict[str, Any]) -> st.SearchStrategy[tuple[str, str, str]]:
    """(key, value text, what the refusal says) for every vLLM keyword of a plain kind, and for bounds."""
    from ascend_kernel.cli.engine_args import Bounds

    cases = []
    for key, tp in sorted(vllm_types.items()):
        plain, nullable = _plain(tp)
        if plain in (bool, int, float):
            words = {bool: "true or false", int: "a whole number", float: "a number"}[plain]
            cases.append(st.tuples(st.just(key), ARG_TEXT.filter(
                lambda t, k=plain, n=nullable: _not_a(k, t, n)), st.just(f"vLLM's {key} takes {words}")))
        elif get_origin(plain) is Literal and all(isinstance(c, str) for c in get_args(plain)):
            choices = get_args(plain)
            cases.append(st.tuples(st.just(key), ARG_TEXT.filter(
                lambda t, c=choices, n=nullable: t not in c and _decoded(t) not in c
                and not (n and _decoded(t) is None)), st.just(f"vLLM's {key} takes one of ")))
        bounds = next((b for b in getattr(tp, "__metadata__", ()) if isinstance(b, Bounds)), None)
        if bounds is not None and plain in (int, float):
            outside = (st.integers(-10**6, 10**6) if plain is int else st.floats(allow_nan=True)) \
                .filter(lambda v, b=bounds: not b.allows(v))
            cases.append(st.tuples(st.just(key), outside.map(json.dumps), st.just(f"must be {bounds}")))
    return st.one_of(cases)


@pytest.fixture(scope="module")
def bad_engine_args(vllm_types):
    return _bad_engine_arg(vllm_types)


@FUZZ
@given(data=st.data())
def test_engine_arg_value_vllm_would_refuse(model_dir, vllm_types, bad_engine_args, data):
    key, text, says = data.draw(bad_engine_args, label="engine arg")
    refused(["generate", "--model", model_dir, "--engine-arg", f"{key}={text}"],
            f"--engine-arg {key}={text!r} is not allowed", says)


@pytest.mark.parametrize(("argv", "says"), [
    (["--engine-arg", "max_num_seqs=0"], "vLLM's SchedulerConfig.max_num_seqs must be >= 1"),
    (["--engine-arg", "max_num_batched_tokens=-16"], "vLLM's SchedulerConfig.max_num_batched_tokens must be >= 1"),
    (["--engine-arg", "gpu_memory_utilization=1.5"], "vLLM's CacheConfig.gpu_memory_utilization must be > 0 and <= 1"),
    (["--engine-arg", "block_size=0"], "vLLM's CacheConfig.block_size must be > 0"),
    (["--engine-arg", "tensor_parallel_size=0"], "vLLM's ParallelConfig.tensor_parallel_size must be >= 1"),
    (["--speculative-config", '{"methd": "ngram"}'], "SpeculativeConfig has no field 'methd' (did you mean 'method'?)"),
])
def test_what_vllm_config_classes_refuse_is_refused_before_vllm_sees_it(model_dir, argv, says):
    """Bounds and keys vLLM's config classes declare (and enforce only while building the engine)."""
    refused(["generate", "--model", model_dir, *argv], "is not allowed: ", says)


@FUZZ
@given(key=IDENTIFIER, value=ARG_TEXT)
def test_engine_arg_vllm_does_not_have(model_dir, vllm_types, key, value):
    assume(key not in vllm_types)
    refused(["explain", "--model", model_dir, f"--engine-arg={key}={value}"],
            f"vLLM has no engine argument {key!r}", "keywords of vllm.LLM")


@FUZZ
@given(text=ARG_TEXT.filter(lambda t: "=" not in t or not t.partition("=")[0].strip()))
def test_engine_arg_that_is_no_pair(model_dir, text):
    refused(["generate", "--model", model_dir, f"--engine-arg={text}"], "argument --engine-arg:",
            "must look like KEY=VALUE")


@FUZZ
@given(dtype=ARG_TEXT)
def test_dtype_vllm_does_not_know(model_dir, vllm_types, dtype):
    plain, _ = _plain(vllm_types["dtype"])
    assert get_origin(plain) is Literal
    assume(dtype not in get_args(plain))
    refused(["generate", "--model", model_dir, f"--dtype={dtype}"], f"--dtype {dtype!r} is not allowed",
            "vLLM's dtype takes one of 'auto'")


# -- paths ----------------------------------------------------------------------------------------


@FUZZ
@given(command=st.sampled_from(["generate", "explain"]), kind=st.sampled_from(["missing", "file", "no config"]),
       name=st.text(string.ascii_letters + string.digits + " ._-", min_size=1, max_size=12))
def test_model_that_is_no_model_directory(tmp_path_factory, taken, command, kind, name):
    base = tmp_path_factory.getbasetemp()
    model = {"missing": str(base / f"missing-{name}"), "file": taken["file"], "no config": taken["dir"]}[kind]
    refused([command, "--model", model], f"argument --model: {model!r}", "give a local model directory")


@FUZZ
@given(command=st.sampled_from(["tiny-model", "real-model"]), kind=st.sampled_from(["file", "dir", "blank", "nul"]),
       text=ARG_TEXT, joined=st.booleans())
# found by fuzzing (issue 19): argparse reads a value that starts with '-' as an option
@example(command="tiny-model", kind="nul", text="-", joined=False)
@example(command="real-model", kind="nul", text="-", joined=True)
def test_out_that_cannot_be_written(taken, command, kind, text, joined):
    out = {"file": taken["file"], "dir": taken["dir"], "blank": " " * (len(text) % 3), "nul": text + "\0"}[kind]
    if not joined and out.startswith("-"):
        # argparse's convention stays (the value could be a mistyped option); the refusal shows the way out
        refused([command, "--out", out], "argument --out: expected one argument", repr(out), "--out=VALUE")
        out_args = [f"--out={out}"]
    else:
        out_args = [f"--out={out}"] if joined else ["--out", out]
    err = refused([command, *out_args], "--out", repr(out))
    assert "give a new or empty directory" in err or "give a directory path" in err


def test_dash_value_hint_only_for_the_option_that_lost_its_value(taken):
    """A value after another option is not blamed; an option at the end of the line keeps argparse's message."""
    err = refused(["tiny-model", "--arch", "llama", "--out"], "argument --out: expected one argument")
    assert "starts with '-'" not in err
    refused(["tiny-model", "--out", "--arch", "llama"], "'--arch' starts with '-'", "--out=VALUE")


@FUZZ
@given(arch=ARG_TEXT)
def test_tiny_model_arch_it_cannot_build(taken, arch):
    from ascend_kernel.models import SUPPORTED_ARCHS

    assume(arch not in SUPPORTED_ARCHS)
    refused(["tiny-model", "--out", taken["dir"], f"--arch={arch}"], f"argument --arch: invalid choice: {arch!r}",
            "'llama'")


# -- settings in the environment ------------------------------------------------------------------

SETTINGS_COMMANDS = ["plugins", "settings", "generate", "explain"]
VARIABLE_TAIL = st.text(string.ascii_uppercase + string.digits + "_", min_size=1, max_size=20)


@FUZZ
@given(command=st.sampled_from(SETTINGS_COMMANDS), tail=VARIABLE_TAIL, value=ENV_TEXT)
def test_variable_that_is_no_setting(model_dir, command, tail, value):
    name = ENV_PREFIX + tail
    assume(name not in {KernelSettings.env_name(f) for f in ALL_FIELDS})
    argv = [command, *(["--model", model_dir] if command in ("generate", "explain") else [])]
    refused(argv, f"{name}={value!r} is not a setting", "`ascend-kernel settings` lists every setting",
            env={name: value})


@pytest.mark.parametrize("field", sorted(ALL_FIELDS))
def test_settings_names_the_setting_a_variable_nearly_is(field):
    """``ascend-kernel settings`` reports a misspelt variable with the setting it was probably meant to be."""
    name = KernelSettings.env_name(field) + "X"
    err = refused(["settings"], f"{name}='1' is not a setting (did you mean {KernelSettings.env_name(field)}?)",
                  env={name: "1"})
    assert err.count("did you mean") == 1


def _rejected(env: dict[str, str]) -> bool:
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.upper().startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(env)
        load_settings()
        return False
    except Exception:  # noqa: BLE001 - any refusal; the CLI's wording is what the test checks
        return True
    finally:
        os.environ.clear()
        os.environ.update(saved)


CHECKED_SETTINGS = [f for f, info in ALL_FIELDS.items()
                    if info.annotation in (bool, int) or get_origin(info.annotation) is Literal]


@FUZZ
@given(command=st.sampled_from(SETTINGS_COMMANDS), field=st.sampled_from(CHECKED_SETTINGS), value=ENV_TEXT)
def test_setting_with_a_value_it_does_not_take(model_dir, command, field, value):
    from ascend_kernel.settings import allowed_values

    name = KernelSettings.env_name(field)
    assume(_rejected({name: value}))
    argv = [command, *(["--model", model_dir] if command in ("generate", "explain") else [])]
    err = refused(argv, f"{name}={value!r}" if value.strip() else f"{name} is set but empty", env={name: value})
    allowed = allowed_values(field)
    assert allowed in err or "Input should be" in err

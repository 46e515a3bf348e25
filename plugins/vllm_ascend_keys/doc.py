"""docs/vllm-ascend-config.md, generated from the rule tables (``python -m ascend_kernel_plugins.vllm_ascend_keys.doc``
prints it; ``--check`` compares it with the committed page)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

from ascend_kernel_plugins.vllm_ascend_keys.envs import COMPANIONS, ENVS, REPLACED_BY
from ascend_kernel_plugins.vllm_ascend_keys.keys import KEYS, PASSED
from ascend_kernel_plugins.vllm_ascend_keys.rules import DOC_PAGE, Section

INTRO = """# vllm-ascend's configuration on the kernel

Generated from `plugins/vllm_ascend_keys/` (`python -m ascend_kernel_plugins.vllm_ascend_keys.doc > {page}`;
tests/test_vllm_ascend_keys.py checks that it is current). Do not edit by hand.

A launch command written for vllm-ascend runs on the kernel as it is: every top-level key of vllm-ascend's
`additional_config` (from v0.9.1 to v0.23.0 and on main, and the seed's) and every `VLLM_ASCEND_*` variable
is either **honored** — mapped onto a kernel setting, or accepted because its value is what the kernel does
anyway — or **refused at start-up** with one paragraph naming the key, why, and what to use instead. Nothing
is ignored silently: a key nobody knows is refused with the closest known name (`did you mean ...?`), at every
level of a section; so is an unknown `VLLM_ASCEND_*` variable.

The translation runs where the kernel loads its settings (`ascend-kernel explain` refuses before any engine
starts), as the settings model of the plugin `vllm-ascend-keys`, for the plugin installed whether or not it is
enabled. As in vllm-ascend, a key of `additional_config` wins over the variable it replaces (which is then not read). A setting given
both ways (`additional_config["ascend_kernel"]` or `ASCEND_KERNEL_*`, and a vllm-ascend key) with different
values is refused. Every honored key is recorded as a config change of the plugin `vllm-ascend-keys`, which
`ascend-kernel explain` and the engine's report list.

"Honored when off" means the value that leaves vllm-ascend's feature off (`false`, `0`, an empty list,
`{{"enabled": false}}`) is accepted and changes nothing, and any other value is refused.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(name: str, rule: Any, seen: str) -> Iterator[str]:
    yield f"| `{name}` | {seen} | {_cell(rule.doc())} |"
    if isinstance(rule, Section):
        for key, sub in rule.keys.items():
            yield from _rows(f"{name}.{key}", sub, "")


def markdown() -> str:
    lines = [INTRO.format(page=DOC_PAGE), "## `additional_config` keys", "",
             "| key | where vllm-ascend reads it | what the kernel does |", "|---|---|---|"]
    for name, (rule, seen) in sorted(KEYS.items(), key=lambda item: item[0].lower()):
        lines.extend(_rows(name, rule, seen))
    lines += ["", "## Environment variables", "", "| variable | where vllm-ascend reads it | what the kernel does |",
              "|---|---|---|"]
    for name, (rule, seen) in sorted(ENVS.items()):
        replaced = f"; not read when `{REPLACED_BY[name]}` is given" if name in REPLACED_BY else \
            f"; on is honored beside `eplb_config.{COMPANIONS[name]}` on" if name in COMPANIONS else ""
        lines.extend(_rows(name, rule, seen + replaced))
    lines += ["", "## Keys that are not vllm-ascend's", "", "| key | read by |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(rule.reader)} |" for name, rule in PASSED.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        page = Path(argv[1]) if len(argv) > 1 else Path(DOC_PAGE)
        if page.read_text() != markdown():
            print(f"{page} is out of date: python -m ascend_kernel_plugins.vllm_ascend_keys.doc > {DOC_PAGE}")
            return 1
        return 0
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

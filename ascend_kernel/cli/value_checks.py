"""Checks of command-line values that plugins contribute (hook ``ascend_kernel_cli_value_checks``).

The CLI imports no plugin. Where a plugin knows what a flag's value may be
(the kv-transfer plugin: ``--kv-transfer-config`` and ``serve-pd``'s
``--mooncake-protocol``), the CLI asks the enabled plugins for their checks
and runs each on the value as given, before anything starts. A disabled
plugin checks nothing, as it configures nothing.
"""

from __future__ import annotations

from typing import Any, Callable


def checks_for(option: str) -> list[Callable[[str, str], Any]]:
    """Every enabled plugin's check of ``option`` (a flag's destination name), in plugin order."""
    from ascend_kernel.plugin_manager import KernelPluginManager
    from ascend_kernel.settings import load_settings

    manager = KernelPluginManager(load_settings())
    answers = manager.pm.hook.ascend_kernel_cli_value_checks()
    return [answer[option] for answer in reversed(answers) if answer and option in answer]


def check_value(option: str, text: str, flag: str) -> None:
    """Run every check of ``option`` on ``text``; the first that refuses raises its UsageError."""
    for check in checks_for(option):
        check(text, flag)

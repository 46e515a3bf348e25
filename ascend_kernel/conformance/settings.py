"""The settings contract: what a plugin declares through ``ascend_kernel_settings``.

Reported under the family ``settings``, implementation = the model's class
name. Checks:

* ``settings-model``: the hook returns a pydantic model class (or None: no rows);
* ``settings-described``: every field has a description (``ascend-kernel
  settings`` and docs/settings.md show it);
* ``settings-names``: every field name is a lower-case identifier (its variable
  is ``ASCEND_KERNEL_<NAME>``) and is not a core setting nor another installed
  plugin's (a clash stops every start-up);
* ``settings-defaults``: the model builds from its defaults alone (no
  variable set is a valid configuration);
* ``settings-importable``: the class is reachable by its module and name
  (worker processes unpickle the settings by reference to it).
"""

from __future__ import annotations

import importlib
from typing import Any

from ascend_kernel.conformance.results import Checks, describe_exception

FAMILY = "settings"


def check_settings(plugin: str, hookimpl: Any, entry_point: str, others: list[tuple[str, Any]]) -> list:
    """Rows for one plugin's settings declaration; ``others``: [(plugin, model)] of every other installed plugin."""
    from pydantic import BaseModel

    from ascend_kernel.settings import KernelSettings

    try:
        model = hookimpl.function()
    except Exception as exc:  # noqa: BLE001
        checks = Checks(plugin, FAMILY, "-", entry_point)
        checks.failed("settings-model", f"ascend_kernel_settings raised {describe_exception(exc)}")
        return checks.results
    if model is None:
        return []
    checks = Checks(plugin, FAMILY, getattr(model, "__name__", repr(model)), entry_point)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        checks.failed("settings-model", f"returned {model!r}; expected a pydantic model class (or None)")
        return checks.results
    checks.passed("settings-model", f"{len(model.model_fields)} field(s)")
    bare = sorted(name for name, info in model.model_fields.items() if not (info.description or "").strip())
    if bare:
        checks.failed("settings-described", "fields without a description: " + ", ".join(bare))
    else:
        checks.passed("settings-described", "every field has a description")
    owners = {name: "the core" for name in KernelSettings.model_fields}
    owners.update({name: f"plugin '{other}'" for other, m in others if m is not model for name in m.model_fields})
    problems = [f"'{name}' is not a lower-case identifier" for name in model.model_fields
                if not (name.isidentifier() and name == name.lower())]
    problems += [f"'{name}' ({KernelSettings.env_name(name)}) is also declared by {owners[name]}"
                 for name in model.model_fields if name in owners]
    if problems:
        checks.failed("settings-names", "; ".join(problems))
    else:
        checks.passed("settings-names", "lower-case, and clash with no core or installed plugin setting")
    try:
        model()
        checks.passed("settings-defaults", "builds from its defaults")
    except Exception as exc:  # noqa: BLE001
        checks.failed("settings-defaults", f"does not build from its defaults: {describe_exception(exc)}")
    try:
        found = getattr(importlib.import_module(model.__module__), model.__qualname__, None)
    except Exception:  # noqa: BLE001
        found = None
    if found is model:
        checks.passed("settings-importable", f"{model.__module__}.{model.__qualname__}")
    else:
        checks.failed("settings-importable", f"{model.__module__}.{model.__qualname__} does not lead back to the "
                      "class: define it at module level (worker processes unpickle settings by reference)")
    return checks.results

"""The plugins installed: the entry points of group ``ascend_kernel.plugins``, and the settings they declare.

Below both the settings and the plugin manager: :func:`declared_settings` is
what the settings compose their class from, before any plugin is loaded, and
the manager loads the same entry points afterwards. The name rule
(:func:`normalise_name`) lives here for both.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any, Iterable

import pluggy

from ascend_kernel import hookspecs
from ascend_kernel.errors import SettingsError

ENTRY_POINT_GROUP = "ascend_kernel.plugins"
BUILTIN_DISTRIBUTION = "ascend-kernel"


def normalise_name(name: str) -> str:
    """Implementation and plugin names compare case-insensitively, ``_`` == ``-``."""
    return name.strip().lower().replace("_", "-")


def describe_entry_point(ep: metadata.EntryPoint) -> str:
    return f"{ep.group}: {ep.name} = {ep.value}"


def distribution_of(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else "?"


def discover_entry_points() -> list[metadata.EntryPoint]:
    """All ``ascend_kernel.plugins`` entry points, built-ins first, each group by name."""
    eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    unique: dict[tuple[str, str], metadata.EntryPoint] = {}
    for ep in eps:  # the same dist can be visible twice on odd sys.paths
        unique.setdefault((ep.name, ep.value), ep)
    return sorted(
        unique.values(),
        key=lambda ep: (normalise_name(distribution_of(ep)) != BUILTIN_DISTRIBUTION, normalise_name(ep.name)),
    )


SETTINGS_HOOK = "ascend_kernel_settings"
_marker_reader = pluggy.PluginManager(hookspecs.PROJECT_NAME)
_declared: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}


def declared_settings(entry_points: Iterable[metadata.EntryPoint] | None = None,
                      builtin_only: bool = False) -> list[tuple[str, Any]]:
    """[(plugin name, settings model)] of every installed plugin that declares one, in load order.

    Disabled plugins count (their settings are checked and have no effect). A
    plugin that fails to import declares nothing here; the manager reports the
    failure when it loads the plugins. Discovery (~20 ms) is remembered per
    ``sys.path``: a plugin installed into a path already searched is seen by
    the next process.
    """
    key = (tuple(sys.path), builtin_only)
    if entry_points is None and key in _declared:
        return list(_declared[key])
    declared = []
    for ep in discover_entry_points() if entry_points is None else entry_points:
        if builtin_only and normalise_name(distribution_of(ep)) != BUILTIN_DISTRIBUTION:
            continue
        try:
            module = ep.load()
        except Exception:  # noqa: BLE001
            continue
        if _marker_reader.parse_hookimpl_opts(module, SETTINGS_HOOK) is not None:
            try:
                model = getattr(module, SETTINGS_HOOK)()
            except Exception as exc:  # noqa: BLE001 - a SettingsError is what register() reports
                raise SettingsError(f"{SETTINGS_HOOK} of plugin '{normalise_name(ep.name)}' "
                                    f"({describe_entry_point(ep)}) raised {type(exc).__name__}: {exc}") from exc
            if model is not None:
                declared.append((normalise_name(ep.name), model))
    if entry_points is None:
        _declared[key] = list(declared)
    return declared

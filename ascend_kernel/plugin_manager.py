"""Loading plugins: built-ins and third parties through one entry-point group.

Every feature, built-in or not, is a plugin registered under the entry-point
group ``ascend_kernel.plugins``. Built-ins (the ``ascend-kernel`` distribution)
load first, in name order, then third parties in name order (pytest's and
conda's order), so a report always lists them the same way.

``ASCEND_KERNEL_PLUGINS`` (allowlist) and ``ASCEND_KERNEL_DISABLE_PLUGINS``
(denylist) act here, once. The settings models plugins declare
(``ascend_kernel_settings``) are read earlier, by
:func:`ascend_kernel.entry_points.declared_settings`,
from every installed plugin whether enabled or not: the settings decide which
plugins load, so the set of settings cannot depend on that. A plugin module that declares
``ASCEND_KERNEL_ESSENTIAL = "<why>"`` refuses to be disabled. A plugin that
fails to import is an error when the allowlist asked for it by name, a
recorded warning otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any, Iterable

import pluggy

from ascend_kernel import hookspecs, hookspecs_tp
from ascend_kernel.entry_points import (
    BUILTIN_DISTRIBUTION,
    SETTINGS_HOOK,
    describe_entry_point,
    discover_entry_points,
    distribution_of,
)
from ascend_kernel.errors import PluginError
from ascend_kernel.registry import Implementation
from ascend_kernel.settings import KernelSettings, normalise_name

logger = logging.getLogger("ascend_kernel")

ESSENTIAL_ATTRIBUTE = "ASCEND_KERNEL_ESSENTIAL"


@dataclass(slots=True)
class PluginInfo:
    """One discovered plugin and what became of it."""

    name: str
    entry_point: str
    distribution: str
    builtin: bool
    status: str  # "loaded" | "disabled" | "not allowed" | "failed"
    detail: str = ""
    essential: str | None = None
    hooks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entry_point": self.entry_point,
            "distribution": self.distribution,
            "builtin": self.builtin,
            "status": self.status,
            "detail": self.detail,
            "essential": self.essential,
            "hooks": list(self.hooks),
        }


class KernelPluginManager:
    """A pluggy manager loaded according to the settings, plus per-plugin calls.

    Registration hooks are called plugin by plugin so that every entry knows
    which plugin (and entry point) contributed it; that is what decision
    records and error messages name.
    """

    def __init__(self, settings: KernelSettings, entry_points: Iterable[metadata.EntryPoint] | None = None):
        self.settings = settings
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.pm.add_hookspecs(hookspecs_tp)
        self.infos: list[PluginInfo] = []
        self._entry_points: dict[str, str] = {}
        if settings.trace_plugins:
            self.pm.trace.root.setwriter(lambda msg: logger.info("pluggy: %s", msg.rstrip()))
            self.pm.enable_tracing()
        self._load(discover_entry_points() if entry_points is None else list(entry_points))

    # -- loading -------------------------------------------------------------

    def _load(self, entry_points: list[metadata.EntryPoint]) -> None:
        allow = set(self.settings.plugins) if self.settings.plugins is not None else None
        deny = set(self.settings.disable_plugins)
        seen: dict[str, str] = {}
        for ep in entry_points:
            name = normalise_name(ep.name)
            where = describe_entry_point(ep)
            dist = distribution_of(ep)
            if name in seen:
                raise PluginError(
                    f"Two plugins are named '{name}': {seen[name]} and {where}. "
                    "Plugin names must be unique; uninstall or rename one."
                )
            seen[name] = where
            info = PluginInfo(name, where, dist, normalise_name(dist) == BUILTIN_DISTRIBUTION, "loaded")
            self.infos.append(info)
            wanted = name not in deny and (allow is None or name in allow)
            try:
                module = ep.load()
            except Exception as exc:  # noqa: BLE001
                info.status, info.detail = "failed", f"{type(exc).__name__}: {exc}"
                if wanted and allow is not None:
                    raise PluginError(
                        f"Plugin '{name}' ({where}) is listed in ASCEND_KERNEL_PLUGINS but failed "
                        f"to import: {info.detail}"
                    ) from exc
                if wanted:
                    logger.warning("ascend-kernel: plugin '%s' (%s) failed to import and is skipped: %s",
                                   name, where, info.detail)
                continue
            info.essential = getattr(module, ESSENTIAL_ATTRIBUTE, None)
            if not wanted:
                if info.essential:
                    why = "ASCEND_KERNEL_DISABLE_PLUGINS" if name in deny else "ASCEND_KERNEL_PLUGINS (not listed)"
                    raise PluginError(
                        f"Plugin '{name}' ({where}) cannot be disabled by {why}: it is essential "
                        f"({info.essential}). To replace what it provides, install a plugin with "
                        "another implementation and force its name with the family's setting."
                    )
                info.status = "disabled" if name in deny else "not allowed"
                info.detail = "ASCEND_KERNEL_DISABLE_PLUGINS" if name in deny else "not in ASCEND_KERNEL_PLUGINS"
                continue
            self._register(module, name, where)
            info.hooks = sorted(hc.name for hc in self.pm.get_hookcallers(module) or [])
        self._check_pending()
        self._check_settings_declared()
        unknown = (allow or set()) - set(seen)
        if unknown:
            raise PluginError(
                f"ASCEND_KERNEL_PLUGINS names unknown plugins: {', '.join(sorted(unknown))}. "
                f"Installed: {', '.join(sorted(seen)) or 'none'}."
            )
        unknown = deny - set(seen)
        if unknown:
            raise PluginError(
                f"ASCEND_KERNEL_DISABLE_PLUGINS names unknown plugins: {', '.join(sorted(unknown))}. "
                f"Installed: {', '.join(sorted(seen)) or 'none'}."
            )

    def _register(self, module: ModuleType, name: str, where: str) -> None:
        try:
            self.pm.register(module, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"Plugin '{name}' ({where}) has an invalid hook: {exc}") from exc
        self._entry_points[name] = where

    def _check_settings_declared(self) -> None:
        """Every loaded plugin's settings model is part of the settings (not so when the settings came first)."""
        if not isinstance(self.settings, KernelSettings):
            return
        for name, result in self.call_each(SETTINGS_HOOK):
            if not (isinstance(result, type) and isinstance(self.settings, result)):
                raise PluginError(
                    f"Plugin '{name}' ({self.entry_point_of(name)}) declares the settings {result!r}, but the "
                    "settings given were composed without them (were they loaded before the plugin was installed?)")

    def _check_pending(self) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            plugin_name = self.pm.get_name(exc.plugin) if exc.plugin is not None else "?"
            known = ", ".join(sorted(n for n in dir(self.pm.hook) if n.startswith("ascend_kernel_")))
            raise PluginError(
                f"Plugin '{plugin_name}' ({self._entry_points.get(plugin_name, '?')}) implements an "
                f"unknown hook: {exc}. Known hooks: {known}."
            ) from exc

    # -- calling -------------------------------------------------------------

    def loaded(self) -> list[tuple[str, Any]]:
        return [(name, self.pm.get_plugin(name)) for name in self._entry_points]

    def entry_point_of(self, name: str) -> str:
        return self._entry_points.get(name, "?")

    def call_each(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call ``hook_name`` on each plugin separately: [(plugin name, result)].

        A hook that raises is reported with the plugin's name and entry point.
        """
        results = []
        others = [p for _, p in self.loaded()]
        for name, plugin in self.loaded():
            if not any(impl.plugin is plugin for impl in getattr(self.pm.hook, hook_name).get_hookimpls()):
                continue
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=[p for p in others if p is not plugin])
            try:
                out = caller(**kwargs)
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, PluginError):
                    raise
                from ascend_kernel.errors import KernelError

                if isinstance(exc, KernelError):
                    raise type(exc)(f"plugin '{name}' ({self.entry_point_of(name)}): {exc}") from exc
                raise PluginError(
                    f"Hook {hook_name} of plugin '{name}' ({self.entry_point_of(name)}) raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            results.extend((name, item) for item in out if item is not None)
        return results

    def implementations(self, hook_name: str, family: str) -> list[Implementation]:
        """Collect the entries a registration hook returns, stamped with their origin."""
        entries: list[Implementation] = []
        for name, result in self.call_each(hook_name):
            for entry in result:
                if not isinstance(entry, Implementation) or entry.family != family:
                    raise PluginError(
                        f"Hook {hook_name} of plugin '{name}' ({self.entry_point_of(name)}) returned "
                        f"{entry!r}; expected ascend_kernel.registry.Implementation entries of family '{family}'."
                    )
                entries.append(entry.with_origin(name, self.entry_point_of(name)))
        return entries

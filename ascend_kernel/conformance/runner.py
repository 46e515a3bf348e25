"""Running the kit: every implementation a plugin registers, through its family's contract.

A plugin's settings model (``ascend_kernel_settings``) is checked too, as the
family ``settings`` (:mod:`~.settings`). Implementations are collected plugin by plugin, straight from each plugin's
registration hooks (so one broken plugin does not hide another's entries),
and each family's module checks them (see the modules of this package). A
plugin that registers nothing is listed with one ``registers`` row.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ascend_kernel.conformance.environment import KitEnvironment
from ascend_kernel.conformance.results import CheckResult, Checks, ConformanceReport, describe_exception
from ascend_kernel.errors import KernelError
from ascend_kernel.kernel import GLOBAL_FAMILIES, KV_CACHE_FAMILY, TABLE_FAMILIES, Family
from ascend_kernel.plugin_manager import KernelPluginManager
from ascend_kernel.registry import Implementation
from ascend_kernel.settings import KernelSettings, load_settings, normalise_name

#: family -> the module of this package that holds its contract
CONTRACT_MODULES: dict[str, str] = {
    "attention_backend": "attention_backend",
    "attention_state": "attention_state",
    "attention_mask": "attention_mask",
    "moe_comm": "moe_comm",
    "moe_comm_method": "moe_comm_method",
    "drafter": "drafter",
    "sampler": "sampler",
    "rejection_sampler": "rejection_sampler",
    "graph": "graph",
    "layer_ops": "layer_ops",
    "kv_cache": "kv_cache",
    "quantization": "quantization",
    "eplb_policy": "eplb_policy",
    "fusion_pass": "fusion_pass",
    "tp_comm": "tp_comm",
}
#: a family chosen by a plugin itself, not by the kernel's plan (the EPLB plugin picks its policy when EPLB is on)
EPLB_POLICY_FAMILY = Family("eplb_policy", "ascend_kernel_eplb_policies", "eplb_config.policy", optional=True)
FAMILIES: tuple[Family, ...] = (*GLOBAL_FAMILIES, *TABLE_FAMILIES, KV_CACHE_FAMILY, EPLB_POLICY_FAMILY)
#: the family name under which a plugin's settings declaration is checked (no implementations: a model)
SETTINGS_FAMILY = "settings"


class UnknownPluginError(KernelError):
    """A plugin name the kit was asked to check is not installed, or not loaded."""


@dataclass(frozen=True, slots=True)
class ImplementationCase:
    """One implementation to check (what a pytest parametrization iterates over)."""

    plugin: str
    family: str
    implementation: str
    entry_point: str = ""

    @property
    def id(self) -> str:
        return f"{self.plugin}:{self.family}:{self.implementation}"

    def check(self, *, distributed: bool = False, cache_dir: str | Path | None = None,
              settings: KernelSettings | None = None) -> list[CheckResult]:
        report = run_conformance([self.plugin], families=[self.family], implementations=[self.implementation],
                                 distributed=distributed, cache_dir=cache_dir, settings=settings)
        return report.results

    def assert_conforms(self, **kwargs: Any) -> list[CheckResult]:
        """Check this implementation; raise :class:`ConformanceError` naming every broken contract."""
        results = self.check(**kwargs)
        ConformanceReport(results).raise_for_failures()
        return results

    def __str__(self) -> str:
        return self.id


def _manager(settings: KernelSettings) -> KernelPluginManager:
    return KernelPluginManager(settings)


def _collect(manager: KernelPluginManager, family: Family) -> tuple[dict[str, list[Implementation]], list[CheckResult]]:
    """{plugin: entries} for one family, each plugin's hook called on its own; broken registrations as results."""
    by_plugin: dict[str, list[Implementation]] = {}
    problems: list[CheckResult] = []
    caller = getattr(manager.pm.hook, family.hook)
    for impl in caller.get_hookimpls():
        plugin = impl.plugin_name
        where = manager.entry_point_of(plugin)
        try:
            out = impl.function()
            entries = list(out or [])
            bad = [e for e in entries if not isinstance(e, Implementation) or e.family != family.name]
            if bad:
                raise TypeError(f"returned {bad[0]!r}; expected Implementation entries of family '{family.name}'")
        except Exception as exc:  # noqa: BLE001
            problems.append(CheckResult(plugin, family.name, "-", "registration", "fail",
                                        f"{family.hook} raised or returned wrong entries: {describe_exception(exc)}",
                                        entry_point=where))
            continue
        by_plugin.setdefault(plugin, []).extend(e.with_origin(plugin, where) for e in entries)
    return by_plugin, problems


def implementation_cases(plugins: Sequence[str] | None = None, *,
                         settings: KernelSettings | None = None) -> list[ImplementationCase]:
    """Every (plugin, family, implementation) the kit would check; cheap (no vLLM import)."""
    settings = settings if settings is not None else load_settings()
    manager = _manager(settings)
    wanted = _wanted(manager, plugins)
    cases = []
    for family in FAMILIES:
        by_plugin, _ = _collect(manager, family)
        for plugin in sorted(by_plugin, key=_order(manager)):
            if plugin in wanted:
                cases.extend(ImplementationCase(plugin, family.name, e.name, e.entry_point) for e in by_plugin[plugin])
    return cases


def _order(manager: KernelPluginManager):
    rank = {info.name: i for i, info in enumerate(manager.infos)}
    return lambda name: rank.get(name, len(rank))


def _wanted(manager: KernelPluginManager, plugins: Sequence[str] | None) -> list[str]:
    loaded = [name for name, _ in manager.loaded()]
    if plugins is None:
        return loaded
    infos = {info.name: info for info in manager.infos}
    wanted = []
    for raw in plugins:
        name = normalise_name(raw)
        if name not in infos:
            raise UnknownPluginError(
                f"no ascend-kernel plugin named '{raw}' is installed; installed: {', '.join(sorted(infos)) or 'none'} "
                "(plugins are entry points in the group 'ascend_kernel.plugins')")
        if name not in loaded:
            info = infos[name]
            raise UnknownPluginError(f"plugin '{name}' ({info.entry_point}) is {info.status}"
                                     + (f": {info.detail}" if info.detail else ""))
        wanted.append(name)
    return wanted


def run_conformance(plugins: Sequence[str] | None = None, *, families: Sequence[str] | None = None,
                    implementations: Sequence[str] | None = None, distributed: bool = False,
                    cache_dir: str | Path | None = None, settings: KernelSettings | None = None) -> ConformanceReport:
    """Check every implementation of ``plugins`` (all loaded plugins when None) against its family's contract.

    ``families`` / ``implementations`` narrow the run; ``distributed`` adds the
    two-rank (gloo) check of MoE comm methods.
    """
    settings = settings if settings is not None else load_settings()
    manager = _manager(settings)
    wanted = _wanted(manager, plugins)
    kit = KitEnvironment(settings, cache_dir)
    report = ConformanceReport()
    collected: dict[str, dict[str, list[Implementation]]] = {}
    for family in FAMILIES:
        by_plugin, problems = _collect(manager, family)
        collected[family.name] = by_plugin
        kit.entries[family.name] = [e for entries in by_plugin.values() for e in entries]
        report.results.extend(p for p in problems if p.plugin in wanted)
    names = {normalise_name(n) for n in implementations} if implementations is not None else None
    if families is None or SETTINGS_FAMILY in families:
        report.results.extend(_settings_results(manager, wanted))
    for plugin in wanted:
        registered = False
        for family in FAMILIES:
            if families is not None and family.name not in families:
                continue
            for entry in collected[family.name].get(plugin, []):
                registered = True
                if names is not None and entry.name not in names:
                    continue
                report.results.extend(check_implementation(entry, kit, distributed=distributed))
        if not registered and families is None:
            hooks = next((i.hooks for i in manager.infos if i.name == plugin), [])
            report.results.append(CheckResult(
                plugin, "-", "-", "registers", "skip",
                "registers no implementations" + (f" (hooks: {', '.join(hooks)})" if hooks else ""),
                entry_point=manager.entry_point_of(plugin)))
    return report


def _settings_results(manager: KernelPluginManager, wanted: list[str]) -> list[CheckResult]:
    """The settings contract of each wanted plugin that declares settings (:mod:`~.settings`)."""
    from ascend_kernel.conformance.settings import check_settings
    from ascend_kernel.entry_points import declared_settings

    installed = declared_settings()
    results = []
    for impl in manager.pm.hook.ascend_kernel_settings.get_hookimpls():
        if impl.plugin_name in wanted:
            others = [(p, m) for p, m in installed if p != impl.plugin_name]
            results += check_settings(impl.plugin_name, impl, manager.entry_point_of(impl.plugin_name), others)
    return results


def check_implementation(entry: Implementation, kit: KitEnvironment, *, distributed: bool = False) -> list[CheckResult]:
    checks = Checks(entry.plugin, entry.family, entry.name, entry.entry_point)
    clash = [e for e in kit.entries.get(entry.family, []) if e is not entry
             and {e.name, *e.aliases} & {entry.name, *entry.aliases}]
    if clash:
        checks.failed("unique-name", "the name is also registered by " + ", ".join(e.origin for e in clash))
    module = importlib.import_module(f"ascend_kernel.conformance.{CONTRACT_MODULES[entry.family]}")
    try:
        if distributed and hasattr(module, "check_entry_distributed"):
            module.check_entry_distributed(entry, kit, checks)
        else:
            module.check_entry(entry, kit, checks)
    except Exception as exc:  # noqa: BLE001 - the kit itself must never hide a result
        checks.failed("kit", f"the {entry.family} checks stopped: {describe_exception(exc)}")
    return checks.results

"""The kernel: settings + plugins + one choice per family, made once per process.

The platform calls :func:`activate` from ``check_and_update_config`` (and a
worker process calls it again from the pickled config, without re-running the
config hooks). Everything after that reads :func:`current`. The chosen objects
live in a frozen, slotted :class:`KernelPlan`; the runner binds their methods
at init and calls them directly in the decode loop.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ascend_kernel.config_changes import ConfigChange
from ascend_kernel.device import Device, DeviceInfo, describe_device, resolve_device_kind
from ascend_kernel.errors import PluginError, SelectionError
from ascend_kernel.plugin_manager import KernelPluginManager
from ascend_kernel.registry import (
    Candidate, DecisionRecord, Implementation, check_unique_names, choose, evaluate_support,
)
from ascend_kernel.settings import KernelSettings, load_settings

logger = logging.getLogger("ascend_kernel")


@dataclass(frozen=True, slots=True)
class Family:
    """A family of interchangeable implementations and how it is chosen."""

    name: str
    hook: str
    setting: str
    optional: bool = False  # may end up unused (e.g. no drafter without speculation)


#: The families chosen once per process, in the order they are resolved.
GLOBAL_FAMILIES: tuple[Family, ...] = (
    # the drafter first: it declares the attention state of its verification batches, which the
    # attention-state policy reads from ``ctx.chosen`` (a family may read the choices made before it)
    Family("drafter", "ascend_kernel_drafters", "drafter", optional=True),
    # before moe_comm: the MoE policy may read the checkpoint's expert scheme from the chosen quantization
    Family("quantization", "ascend_kernel_quant_methods", "quantization", optional=True),
    Family("attention_backend", "ascend_kernel_attention_backends", "attention_backend"),
    Family("attention_state", "ascend_kernel_attention_state_policies", "attention_state"),
    Family("attention_mask", "ascend_kernel_attention_masks", "attention_mask"),
    Family("moe_comm", "ascend_kernel_moe_comm_policies", "moe_comm"),
    Family("sampler", "ascend_kernel_samplers", "sampler"),
    Family("rejection_sampler", "ascend_kernel_rejection_samplers", "rejection_sampler", optional=True),
    Family("graph", "ascend_kernel_graph_modes", "graph_mode"),
    Family("layer_ops", "ascend_kernel_layer_ops", "layer_ops"),
    # last: a TP-communication policy reads the chosen layers, MoE policy and graph mode (hookspecs_tp.py)
    Family("tp_comm", "ascend_kernel_tp_comm_policies", "tp_comm"),
)
#: Families whose every supported implementation is built, a named table that
#: a chosen object of another family picks from per batch (MoE comm methods,
#: picked by the moe_comm policy). Their forcing setting is read by that consumer.
TABLE_FAMILIES: tuple[Family, ...] = (
    Family("moe_comm_method", "ascend_kernel_moe_comm_methods", "moe_comm_method", optional=True),
    Family("fusion_pass", "ascend_kernel_fusion_passes", "fusion_pass", optional=True),
)
#: Chosen once per KV-cache spec type present in the model.
KV_CACHE_FAMILY = Family("kv_cache", "ascend_kernel_kv_cache_layouts", "kv_cache_layout")


@dataclass(frozen=True, slots=True)
class SelectionContext:
    """What ``supports(ctx)`` predicates and factories are given."""

    vllm_config: Any
    settings: KernelSettings
    device: DeviceInfo
    subject: Any = None
    #: the built tables of :data:`TABLE_FAMILIES`: family name -> {implementation name: object}
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the objects of the global families resolved so far (in :data:`GLOBAL_FAMILIES` order; None if unused)
    chosen: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """The chosen object of every global family (None for an unused optional one)."""

    attention_backend: Any
    attention_state: Any
    attention_mask: Any
    moe_comm: Any
    drafter: Any
    sampler: Any
    rejection_sampler: Any
    graph: Any
    layer_ops: Any
    quantization: Any = None
    tp_comm: Any = None
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def objects(self) -> list[Any]:
        """Every chosen object (for lifecycle steps the runner applies to each, e.g. ``prepare_model``)."""
        return [getattr(self, f.name) for f in GLOBAL_FAMILIES if getattr(self, f.name) is not None]


@dataclass(slots=True)
class Kernel:
    """One engine's kernel: its settings, plugins, decisions and config changes."""

    settings: KernelSettings
    device_info: DeviceInfo
    plugins: KernelPluginManager
    records: list[DecisionRecord] = field(default_factory=list)
    config_changes: list[ConfigChange] = field(default_factory=list)
    plan: KernelPlan | None = None
    _kv_layouts: dict[type, tuple[str, Any]] = field(default_factory=dict)
    _entries: dict[str, list[Implementation]] = field(default_factory=dict)
    #: milliseconds this process spent on plugin discovery (``discovery``) and choosing (``selection``)
    startup_ms: dict[str, float] = field(default_factory=dict)

    @property
    def device(self) -> Device:
        return Device(self.device_info.kind)

    def context(self, vllm_config: Any, subject: Any = None) -> SelectionContext:
        return SelectionContext(vllm_config, self.settings, self.device_info, subject)

    def entries(self, family: Family) -> list[Implementation]:
        if family.name not in self._entries:
            self._entries[family.name] = self.plugins.implementations(family.hook, family.name)
        return self._entries[family.name]

    # -- start-up ------------------------------------------------------------

    def configure(self, vllm_config: Any, requested: Any = None) -> list[ConfigChange]:
        """Let every plugin validate and fix its slice of the config (once)."""
        changes = []
        for plugin, result in self.plugins.call_each(
            "ascend_kernel_configure", settings=self.settings, vllm_config=vllm_config,
            device=self.device_info, requested=requested,
        ):
            for item in result:
                if not isinstance(item, ConfigChange):
                    raise PluginError(
                        f"ascend_kernel_configure of plugin '{plugin}' ({self.plugins.entry_point_of(plugin)}) "
                        f"returned {item!r}; expected ConfigChange entries."
                    )
                changes.append(ConfigChange(item.path, item.old, item.new, item.reason, plugin))
        self.config_changes.extend(changes)
        return changes

    def resolve(self, vllm_config: Any) -> KernelPlan:
        """Choose one implementation per global family; idempotent per process."""
        if self.plan is not None:
            return self.plan
        started = time.perf_counter()
        tables = {family.name: self._build_table(family, self.context(vllm_config)) for family in TABLE_FAMILIES}
        chosen: dict[str, Any] = {}
        ctx = SelectionContext(vllm_config, self.settings, self.device_info, None, tables, chosen)
        for family in GLOBAL_FAMILIES:
            impl, record = choose(family.name, self.entries(family), ctx, forced=self.settings.forced(family.setting),
                                  forcing_setting=self.settings.source_name(family.setting), optional=family.optional)
            self.records.append(record)
            chosen[family.name] = impl.build(ctx) if impl is not None else None
        self._check_forced_kv_layout_name()
        self.plan = KernelPlan(**chosen, tables=tables)
        self.startup_ms["selection"] = (time.perf_counter() - started) * 1e3
        for record in self.records:  # the engine's summary is logged once, by its first worker (ascend_kernel.logs)
            logger.debug("ascend-kernel: %s -> %s (%s, %s)", record.family, record.chosen,
                         record.plugin, record.forced_by)
        return self.plan

    def _build_table(self, family: Family, ctx: SelectionContext) -> dict[str, Any]:
        """Build every supported entry of a table family; the record lists them and why others were left out."""
        entries = self.entries(family)
        check_unique_names(family.name, entries)
        built: dict[str, Any] = {}
        candidates = []
        for entry in entries:
            reason = evaluate_support(entry, ctx)
            if reason is None:
                obj = entry.build(ctx)
                for key in (entry.name, *entry.aliases):
                    built[key] = obj
            candidates.append(Candidate(entry.name, entry.plugin, entry.entry_point, entry.priority,
                                        reason is None, "built" if reason is None else f"unsupported: {reason}"))
        names = sorted(e.name for e in entries if e.name in built)
        self.records.append(DecisionRecord(
            family=family.name, subject="", chosen=", ".join(names) or None,
            plugin=", ".join(sorted({e.plugin for e in entries if e.name in built})) or None,
            entry_point=None, forced_by="table: every supported implementation is built; chosen per batch",
            candidates=tuple(candidates)))
        return built

    def kv_layout_for(self, spec_type: type, vllm_config: Any) -> Any:
        """The layout object for one KV-cache spec class (chosen on first use)."""
        return self.kv_layout(spec_type, vllm_config)[1]

    def kv_layout(self, spec_type: type, vllm_config: Any) -> tuple[str, Any]:
        """(name, layout object) for one KV-cache spec class (chosen on first use)."""
        if spec_type not in self._kv_layouts:
            ctx = self.context(vllm_config, subject=spec_type)
            impl, record = choose(KV_CACHE_FAMILY.name, self.entries(KV_CACHE_FAMILY), ctx,
                                  forced=self._forced_kv_layout(spec_type, ctx),
                                  forcing_setting=self.settings.source_name(KV_CACHE_FAMILY.setting),
                                  subject=spec_type.__name__)
            self.records.append(record)
            self._kv_layouts[spec_type] = (impl.name, impl.build(ctx))
        return self._kv_layouts[spec_type]

    def _check_forced_kv_layout_name(self) -> None:
        """A forced KV layout no plugin provides fails here, with the other forced names.

        The layout itself is chosen per spec type at KV-cache init, in the
        workers; an unknown name is known to be wrong before that, in the
        process that configures the engine (a server's front end), where the
        error reaches the user as one paragraph.
        """
        forced = self.settings.forced(KV_CACHE_FAMILY.setting)
        if forced is None:
            return
        entries = self.entries(KV_CACHE_FAMILY)
        if not any(forced in (e.name, *e.aliases) for e in entries):
            known = ", ".join(sorted(e.name for e in entries)) or "none installed"
            raise SelectionError(
                f"Unknown {KV_CACHE_FAMILY.name} '{forced}' (forced by "
                f"{self.settings.source_name(KV_CACHE_FAMILY.setting)}). Choose one of: {known} "
                "(is the plugin that provides it installed and enabled?)")

    def _forced_kv_layout(self, spec_type: type, ctx: SelectionContext) -> str | None:
        """A forced layout applies to the specs it handles; others stay on auto."""
        forced = self.settings.forced(KV_CACHE_FAMILY.setting)
        if forced is None:
            return None
        match = next((e for e in self.entries(KV_CACHE_FAMILY) if forced in (e.name, *e.aliases)), None)
        if match is not None and match.supports(ctx) is not None:
            return None
        return forced

    def report(self) -> dict[str, Any]:
        return {
            "device": self.device_info.as_dict(),
            "decisions": [r.as_dict() for r in self.records],
            "config_changes": [c.as_dict() for c in self.config_changes],
            "plugins": [p.as_dict() for p in self.plugins.infos],
            "startup_ms": dict(self.startup_ms),
        }


_lock = threading.Lock()
_current: Kernel | None = None


def build_kernel(settings: KernelSettings, device_kind: str) -> Kernel:
    return Kernel(settings, describe_device(settings, device_kind), KernelPluginManager(settings))


def activate(vllm_config: Any, *, configure: bool, requested: Any = None) -> Kernel:
    """Create (or reuse) this process's kernel for ``vllm_config``.

    ``configure=True`` runs the config hooks (the platform, once per engine);
    workers in other processes pass False: their config was already fixed.
    """
    global _current
    with _lock:
        settings = load_settings(getattr(vllm_config, "additional_config", None))
        if _current is None or _current.settings != settings or configure:
            kind = resolve_device_kind(settings) or "cpu"
            started = time.perf_counter()
            _current = build_kernel(settings, kind)
            _current.startup_ms["discovery"] = (time.perf_counter() - started) * 1e3
            if configure:
                changes = _current.configure(vllm_config, requested)
                _remember_changes(vllm_config, changes)
            else:
                _current.config_changes.extend(_recorded_changes(vllm_config))
        return _current


#: where the platform leaves its config changes for worker processes (the
#: config is pickled to them; the changes themselves are already applied)
_CHANGES_KEY = "ascend_kernel_config_changes"


def record_changes(vllm_config: Any, changes: list[ConfigChange | None], plugin: str = "platform") -> None:
    """Record config changes the platform itself made (not a plugin's configure hook) with this process's
    kernel and for its workers, so ``ascend-kernel explain`` and the report show them like any other."""
    made = [ConfigChange(c.path, c.old, c.new, c.reason, c.plugin or plugin) for c in changes if c is not None]
    current().config_changes.extend(made)
    _remember_changes(vllm_config, made, keep=True)


def _remember_changes(vllm_config: Any, changes: list[ConfigChange], keep: bool = False) -> None:
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict) and (changes or not keep):
        extra[_CHANGES_KEY] = [*(extra.get(_CHANGES_KEY, []) if keep else ()), *(c.as_dict() for c in changes)]


def _recorded_changes(vllm_config: Any) -> list[ConfigChange]:
    extra = getattr(vllm_config, "additional_config", None) or {}
    return [ConfigChange(c["path"], c["old"], c["new"], c["reason"], c["plugin"])
            for c in extra.get(_CHANGES_KEY, [])]


@functools.cache
def pre_register() -> tuple[str, ...]:
    """Let the plugins register names with vLLM before it builds a config; once per process.

    The platform calls this from ``pre_register_and_update``. Plugins come from
    the environment's settings here (an engine's ``additional_config`` is not
    known yet). Returns what was registered, in words.
    """
    calls = KernelPluginManager(load_settings()).call_each("ascend_kernel_pre_register")
    done = tuple(f"{plugin}: {item}" for plugin, result in calls for item in result)
    logger.info("ascend-kernel: registered with vLLM before its config: %s", "; ".join(done) or "nothing")
    return done


def current() -> Kernel:
    if _current is None:
        raise SelectionError("ascend-kernel is not active in this process (no engine was configured with it)")
    return _current


def current_or_none() -> Kernel | None:
    return _current

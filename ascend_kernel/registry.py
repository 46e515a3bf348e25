"""Named implementations and the once-per-process choice among them.

A plugin contributes :class:`Implementation` entries to a family (through the
family's registration hook). :func:`choose` picks one per family, with a fixed
order of authority: a setting that forces a name > the highest ``priority``
among supported entries > nothing (an error, or "unused" for optional
families). Every choice leaves a :class:`DecisionRecord` that says who won, who
supplied it, and why every other candidate was passed over.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from ascend_kernel.errors import PluginError, SelectionError
from ascend_kernel.settings import normalise_name

#: ``supports(ctx)`` returns None when the implementation can serve the
#: context, or a short human reason why not.
SupportsFn = Callable[[Any], "str | None"]


def _always(_ctx: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Implementation:
    """One named implementation of one family, as contributed by a plugin.

    ``factory`` is called once with the selection context and returns the
    object the runner holds (a class, a callable, or a lazy ``"pkg.mod:attr"``
    path so that heavy imports happen only for the winner). ``priority`` only
    matters when no setting forces a name.
    """

    family: str
    name: str
    factory: Callable[[Any], Any] | str
    supports: SupportsFn = _always
    priority: int = 0
    aliases: tuple[str, ...] = ()
    description: str = ""
    #: filled in by the plugin manager: who contributed this entry
    plugin: str = ""
    entry_point: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", normalise_name(self.name))
        object.__setattr__(self, "aliases", tuple(normalise_name(a) for a in self.aliases))

    def with_origin(self, plugin: str, entry_point: str) -> "Implementation":
        return replace(self, plugin=plugin, entry_point=entry_point)

    @property
    def origin(self) -> str:
        return f"plugin '{self.plugin}' ({self.entry_point})" if self.plugin else "an unnamed plugin"

    def build(self, ctx: Any) -> Any:
        factory = self.factory
        try:
            if isinstance(factory, str):
                module_name, _, attr_path = factory.partition(":")
                factory = importlib.import_module(module_name)
                for attr in attr_path.split("."):
                    factory = getattr(factory, attr)
            return factory(ctx)
        except Exception as exc:  # noqa: BLE001 - re-raised with the culprit named
            raise PluginError(
                f"{self.family} implementation '{self.name}' from {self.origin} failed to build: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


@dataclass(frozen=True, slots=True)
class Candidate:
    """One entry considered for a family, and why it won or lost."""

    name: str
    plugin: str
    entry_point: str
    priority: int
    chosen: bool
    reason: str


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """What was chosen for one family (and subject), by whom, and why."""

    family: str
    subject: str
    chosen: str | None
    plugin: str | None
    entry_point: str | None
    forced_by: str
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        """Every field, the candidates as a list of their fields (JSON for the report and ``explain``)."""
        return {**asdict(self), "candidates": [asdict(c) for c in self.candidates]}


def check_unique_names(family: str, entries: Sequence[Implementation]) -> None:
    """Two entries of one family answering to one name is an error, reported all at once."""
    owners: dict[str, list[Implementation]] = {}
    for entry in entries:
        for key in (entry.name, *entry.aliases):
            owners.setdefault(key, []).append(entry)
    clashes = {k: v for k, v in owners.items() if len(v) > 1}
    if clashes:
        lines = "; ".join(
            f"'{name}' is provided by " + " and ".join(e.origin for e in providers)
            for name, providers in sorted(clashes.items())
        )
        raise SelectionError(
            f"Duplicate {family} implementation names: {lines}. Disable one of the plugins "
            "(ASCEND_KERNEL_DISABLE_PLUGINS) or rename the entry."
        )


def evaluate_support(entry: Implementation, ctx: Any) -> str | None:
    """``entry.supports(ctx)``; a check that raises is a PluginError naming the plugin and entry point."""
    try:
        return entry.supports(ctx)
    except Exception as exc:  # noqa: BLE001
        raise PluginError(
            f"{entry.family} implementation '{entry.name}' from {entry.origin}: its supports() "
            f"check raised {type(exc).__name__}: {exc}"
        ) from exc


def choose(
    family: str,
    entries: Iterable[Implementation],
    ctx: Any,
    *,
    forced: str | None,
    forcing_setting: str,
    subject: str = "",
    optional: bool = False,
) -> tuple[Implementation | None, DecisionRecord]:
    """Pick one implementation of ``family`` for ``ctx``; never a silent first-wins."""
    entries = list(entries)
    check_unique_names(family, entries)
    what = f"{family} for {subject}" if subject else family
    reasons = {entry.name: evaluate_support(entry, ctx) for entry in entries}

    if forced is not None:
        match = next((e for e in entries if forced in (e.name, *e.aliases)), None)
        if match is None:
            known = ", ".join(sorted(e.name for e in entries)) or "none installed"
            raise SelectionError(
                f"Unknown {family} '{forced}' (forced by {forcing_setting}). Choose one of: {known} "
                "(is the plugin that provides it installed and enabled?)"
            )
        if reasons[match.name] is not None:
            raise SelectionError(
                f"{family} '{forced}' (forced by {forcing_setting}) from {match.origin} cannot serve "
                f"{what}: {reasons[match.name]}"
            )
        chosen, forced_by = match, f"setting {forcing_setting}={forced}"
    else:
        supported = sorted((e for e in entries if reasons[e.name] is None), key=lambda e: e.priority, reverse=True)
        if not supported:
            tried = "; ".join(f"{e.name} ({e.origin}): {reasons[e.name]}" for e in entries)
            if optional:
                chosen, forced_by = None, f"unused: no implementation applies ({tried or 'none installed'})"
            else:
                raise SelectionError(
                    f"No {what} implementation supports this configuration. Tried: "
                    f"{tried or 'none installed'}."
                )
        else:
            top = [e for e in supported if e.priority == supported[0].priority]
            if len(top) > 1:
                raise SelectionError(
                    f"{what}: {len(top)} implementations tie at priority {top[0].priority}: "
                    + ", ".join(f"{e.name} ({e.origin})" for e in top)
                    + f". Force one with {forcing_setting}, or disable a plugin."
                )
            chosen = supported[0]
            forced_by = "only supported candidate" if len(supported) == 1 else f"highest priority ({chosen.priority})"

    candidates = []
    for entry in entries:
        if chosen is not None and entry is chosen:
            reason = "chosen"
        elif reasons[entry.name] is not None:
            reason = f"unsupported: {reasons[entry.name]}"
        elif forced is not None:
            reason = f"not the forced name ({forcing_setting}={forced})"
        else:
            reason = f"lower priority ({entry.priority} < {chosen.priority})" if chosen else "unused"
        candidates.append(
            Candidate(entry.name, entry.plugin, entry.entry_point, entry.priority, entry is chosen, reason)
        )
    record = DecisionRecord(family, subject, chosen.name if chosen else None, chosen.plugin if chosen else None,
                            chosen.entry_point if chosen else None, forced_by, tuple(candidates))
    return chosen, record

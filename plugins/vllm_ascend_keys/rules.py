"""The kinds of rule a vllm-ascend key follows, and what applying one gives.

A rule sees the key's path (``torchair_graph_config.enabled``), the value the
user wrote and the names of the settings this installation declares; it
answers with an :class:`Outcome`: the settings the key sets (possibly none,
when the value already is what the kernel does) and a sentence for the
record, or a refusal paragraph. Rules are data: the docs table is generated
from their ``doc`` method, so the table and the behaviour cannot drift.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: the page every refusal points at (generated from these rules)
DOC_PAGE = "docs/vllm-ascend-config.md"


@dataclass(frozen=True)
class Outcome:
    """What one key (or sub-key) came to."""

    path: str
    value: Any
    settings: Mapping[str, Any] = field(default_factory=dict)
    effect: str = ""
    refusal: str = ""


def is_off(value: Any) -> bool:
    """The value a feature toggle has when the feature is not asked for (vllm-ascend's defaults)."""
    if isinstance(value, Mapping):
        return not value or value.get("enabled") in (False, None, 0, "0", "false", "False")
    if isinstance(value, str):
        return value.strip().lower() in ("", "0", "false", "no", "off", "none", "null")
    return value in (None, False, 0) or value == [] or value == ()


def as_bool(value: Any) -> bool:
    """vllm-ascend's toggles are booleans or 0/1 (an environment variable is ``bool(int(text))``)."""
    return not is_off(value)


def as_group_size(value: Any) -> int | None:
    """A parallel group size: None or 0 (off: vllm-ascend's default is 0) or a whole number >= 1 (booleans,
    fractions and negatives are rejected)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{type(value).__name__} is not a group size")
    size = int(value)
    if size < 0:
        raise ValueError(f"{size} is below 0")
    return size or None


def refusal(path: str, value: Any, why: str, instead: str) -> str:
    return (f"{_where(path)}={value!r} is refused: {why}. Instead: {instead}.")


def _where(path: str) -> str:
    if path.startswith("$"):  # an environment variable
        return path[1:]
    return "additional_config" + "".join(f'["{part}"]' for part in path.split("."))


def closest(name: str, known: list[str]) -> str | None:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return match[0] if match else None


def unknown(path: str, value: Any, known: list[str], what: str) -> Outcome:
    name = path.rsplit(".", 1)[-1].lstrip("$")
    guess = closest(name, known)
    hint = f" (did you mean {guess!r}?)" if guess else ""
    return Outcome(path, value, refusal=(
        f"{_where(path)}={value!r} is {what}{hint}; {DOC_PAGE} lists every key the kernel knows and "
        "what it does with each"))


@dataclass(frozen=True)
class Off:
    """A vllm-ascend feature the kernel does not have: honored while off, refused when asked for."""

    feature: str
    instead: str
    off: Callable[[Any], bool] = is_off

    def apply(self, path: str, value: Any, fields: frozenset[str]) -> Outcome:
        if self.off(value):
            return Outcome(path, value, effect=f"nothing to do: the kernel has no {self.feature}")
        return Outcome(path, value, refusal=refusal(path, value, f"the kernel has no {self.feature}", self.instead))

    def doc(self) -> str:
        return f"honored when off (the kernel has no {self.feature}); otherwise refused. Instead: {self.instead}"


@dataclass(frozen=True)
class Refused:
    """A key whose every value asks for something the kernel does not do."""

    why: str
    instead: str

    def apply(self, path: str, value: Any, fields: frozenset[str]) -> Outcome:
        return Outcome(path, value, refusal=refusal(path, value, self.why, self.instead))

    def doc(self) -> str:
        return f"refused: {self.why}. Instead: {self.instead}"


@dataclass(frozen=True)
class Setting:
    """Mapped onto a kernel setting (a plugin's), converted; refused while no installed plugin declares it.

    With ``off_without``, an off value is honored even without the setting: the
    kernel then does not do the feature either. ``expects`` says in words what
    ``convert`` accepts (the refusal of a value it rejects names it).
    """

    setting: str
    convert: Callable[[Any], Any] = as_bool
    feature: str = ""
    off_without: bool = True
    expects: str = "a boolean (true/false or 1/0)"

    def apply(self, path: str, value: Any, fields: frozenset[str]) -> Outcome:
        if self.setting.split(".")[0] in fields:
            try:
                converted = self.convert(value)
            except (TypeError, ValueError) as exc:
                return Outcome(path, value, refusal=refusal(path, value, f"not a value of {self.setting} ({exc})",
                                                            self.expects))
            return Outcome(path, value, {self.setting: converted}, f"setting {self.setting}={converted!r}")
        if self.off_without and is_off(value):
            return Outcome(path, value, effect=f"nothing to do: no installed plugin implements "
                                               f"{self.feature or self.setting}, and the value is off")
        return Outcome(path, value, refusal=refusal(
            path, value, f"it maps onto the kernel setting {self.setting.split('.')[0]}, and no installed plugin "
            f"implements {self.feature or self.setting}", "install a plugin that implements it, or leave the key out"))

    def doc(self) -> str:
        root, _, sub = self.setting.partition(".")
        target = f"`{sub}` of the setting `{root}`" if sub else f"the setting `{root}`"
        return (f"mapped onto {target} (`ASCEND_KERNEL_{root.upper()}`); refused when no installed plugin "
                "implements it" + (" (off is honored then)" if self.off_without else ""))


@dataclass(frozen=True)
class Honored:
    """Any value is what the kernel does anyway."""

    effect: str

    def apply(self, path: str, value: Any, fields: frozenset[str]) -> Outcome:
        return Outcome(path, value, effect=self.effect)

    def doc(self) -> str:
        return f"honored: {self.effect}"


@dataclass(frozen=True)
class Passed:
    """Not vllm-ascend's: a key vLLM or the kernel itself reads, left to its reader."""

    reader: str

    def apply(self, path: str, value: Any, fields: frozenset[str]) -> Outcome | None:
        return None

    def doc(self) -> str:
        return f"left to {self.reader}"


@dataclass(frozen=True)
class Section:
    """A mapping of sub-keys, each with its own rule; an unknown sub-key is refused with a did-you-mean."""

    keys: Mapping[str, Any]
    what: str

    def apply_all(self, path: str, value: Any, fields: frozenset[str]) -> list[Outcome]:
        if not isinstance(value, Mapping):
            return [Outcome(path, value, refusal=refusal(path, value, f"{self.what} is a mapping of sub-keys",
                                                         "a JSON object, e.g. {" + f'"{next(iter(self.keys))}": ...' + "}"))]
        outcomes = []
        for key, sub in value.items():
            rule = self.keys.get(key)
            sub_path = f"{path}.{key}"
            if rule is None:
                outcomes.append(unknown(sub_path, sub, sorted(self.keys), f"no key of {self.what}"))
            else:
                outcomes.extend(apply(rule, sub_path, sub, fields))
        return outcomes

    def doc(self) -> str:
        return f"a section: each sub-key below has its own rule; an unknown sub-key is refused"


def apply(rule: Any, path: str, value: Any, fields: frozenset[str]) -> list[Outcome]:
    """Every outcome of one key: one, or one per sub-key of a section."""
    if hasattr(rule, "apply_all"):
        return rule.apply_all(path, value, fields)
    outcome = rule.apply(path, value, fields)
    return [] if outcome is None else [outcome]

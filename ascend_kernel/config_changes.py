"""Recording what plugins change in the vLLM config, so nothing is changed silently."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("ascend_kernel")


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One field a plugin changed: where, from what, to what, and why."""

    path: str
    old: Any
    new: Any
    reason: str
    plugin: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "old": _shown(self.old), "new": _shown(self.new),
                "reason": self.reason, "plugin": self.plugin}


def _shown(value: Any) -> str:
    """Values as text for reports (already-shown text is kept as is)."""
    return value if isinstance(value, str) else repr(value)


def change(root: Any, path: str, value: Any, reason: str) -> ConfigChange | None:
    """Set ``root.<path>`` to ``value``; return the change, or None if it already was."""
    *parents, leaf = path.split(".")
    obj = root
    for part in parents:
        obj = getattr(obj, part)
    old = getattr(obj, leaf)
    if old == value:
        return None
    setattr(obj, leaf, value)
    logger.info("ascend-kernel: %s: %r -> %r (%s)", path, old, value, reason)
    return ConfigChange(path, old, value, reason)

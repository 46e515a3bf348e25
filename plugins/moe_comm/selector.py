"""From a policy's method name to the method object that serves the batch.

Every policy goes through one :class:`MethodSelector`, so three rules hold
whatever the policy: ``ASCEND_KERNEL_MOE_COMM_METHOD`` forces a name for every
MoE batch; a batch over a method's capacity takes its fallback (counted in the
step trace as ``moe_fallbacks``, ``"mc2->alltoall"``); and a name the policy
can return that no installed plugin provides stops start-up, not a batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ascend_kernel.errors import SelectionError
from ascend_kernel.runner.kernel_runner import current_trace
from ascend_kernel.settings import normalise_name

SETTING = "ASCEND_KERNEL_MOE_COMM_METHOD"


class MethodSelector:
    __slots__ = ("table", "forced", "rule", "names")

    def __init__(self, table: Mapping[str, Any], rule: Callable[[int, bool], str | None], possible: Iterable[str],
                 forced: str | None, policy: str) -> None:
        self.table = {normalise_name(name): method for name, method in table.items()}
        self.rule = rule
        if forced is not None:
            possible = [forced]
        self.forced = normalise_name(forced) if forced is not None else None
        installed = ", ".join(sorted(table)) or "none"
        #: every method name a batch can get: the policy's (or the forced) names and their fallbacks
        self.names: set[str] = set()
        for name in possible:
            self.names.update(self._chain(name, installed, policy))

    def reachable(self) -> list[Any]:
        """The method objects some batch can be served by (sorted by name)."""
        return [self.table[name] for name in sorted(self.names)]

    def _chain(self, name: str, installed: str, policy: str) -> list[str]:
        """The method and every fallback after it must be installed, and the chain must end (returned)."""
        seen: list[str] = []
        while name is not None:
            name = normalise_name(name)
            if name in seen:
                raise SelectionError(f"MoE comm methods fall back in a circle: {' -> '.join(seen + [name])}")
            if name not in self.table:
                origin = f"{SETTING}={self.forced}" if self.forced and not seen else f"MoE comm policy '{policy}'"
                via = f" (fallback of {seen[-1]})" if seen else ""
                raise SelectionError(
                    f"{origin} can choose MoE comm method '{name}'{via}, but no installed plugin provides it. "
                    f"Installed methods: {installed} (is the plugin that provides it installed and enabled?)")
            seen.append(name)
            name = self.table[name].fallback
        return seen

    def select(self, num_tokens: int, with_prefill: bool) -> Any:
        name = self.rule(num_tokens, with_prefill)
        if name is None:
            return None
        method = self.table[self.forced or normalise_name(name)]
        while method.capacity is not None and num_tokens > method.capacity:
            fallback = self.table[normalise_name(method.fallback)]
            trace = current_trace()
            if trace is not None:
                trace.count("moe_fallbacks", f"{method.name}->{fallback.name}")
            method = fallback
        return method

"""What every family's contract starts with: a context the implementation accepts, and its built object.

Two contracts are common to every implementation:

* ``supports``: ``supports(ctx)`` returns None or a reason, and does not raise;
* ``builds``: the factory builds an object under a context ``supports`` accepted.

When no kit context is accepted the family's contracts are skipped, with the
reasons ``supports`` gave.
"""

from __future__ import annotations

from typing import Any, Sequence

from ascend_kernel.conformance.environment import Found, KitEnvironment
from ascend_kernel.conformance.results import Checks, describe_exception
from ascend_kernel.registry import Implementation


def build_under(entry: Implementation, kit: KitEnvironment, checks: Checks, config_names: Sequence[str], *,
                subject: Any = None, each_config: bool = False) -> list[tuple[Found, Any]]:
    """Build ``entry`` under the first accepted context (or one per accepted config with ``each_config``).

    Records ``supports`` and ``builds`` results (a ``supported`` skip when no
    kit context is accepted); the family's own contracts run on what is returned.
    """
    groups = [[name] for name in config_names] if each_config else [list(config_names)]
    built: list[tuple[Found, Any]] = []
    all_reasons: list[str] = []
    for group in groups:
        try:
            found, reasons = kit.find_context(entry, group, subject=subject)
        except Exception as exc:  # noqa: BLE001
            checks.failed("supports", f"supports(ctx) raised {describe_exception(exc)}")
            return []
        all_reasons += reasons
        if found is None:
            continue
        if not checks.context:
            checks.context = found.label
        try:
            obj = entry.build(found.ctx)
        except Exception as exc:  # noqa: BLE001
            cause = exc.__cause__ or exc
            if "simulated" in found.label:
                checks.skipped("builds", f"could not be built on a simulated NPU ({found.label}); it may need a "
                               f"real one: {describe_exception(cause)}")
            else:
                checks.failed("builds", f"the factory raised {describe_exception(cause)} ({found.label})")
            return []
        built.append((found, obj))
    if not built:
        checks.skipped("supported", "no context of the kit is supported: " + "; ".join(all_reasons))
        return []
    checks.passed("builds", ", ".join(f"{type(obj).__name__} under {found.label}" for found, obj in built))
    return built


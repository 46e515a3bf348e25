"""The conformance kit: every family's contract, run against the implementations a plugin registers.

Three ways in:

* from a plugin's own tests: ``from ascend_kernel.conformance import check_plugin;
  check_plugin("my-plugin")`` (raises :class:`ConformanceError` naming every
  broken contract; returns the :class:`ConformanceReport`);
* as a pytest plugin (installed with ascend-kernel, entry point ``pytest11``):
  mark a module or test with ``@pytest.mark.ascend_kernel_plugin("my-plugin")``
  and take the fixture ``ascend_kernel_implementation``: the test runs once per
  implementation the plugin registers (call ``.assert_conforms()`` on it);
  the fixture ``ascend_kernel_conformance`` is :func:`check_plugin`;
* from the shell: ``ascend-kernel conformance [--plugin NAME] [--json] [--distributed]``.

One module per family holds its contract and documents what it checks:
:mod:`~.kv_cache`, :mod:`~.sampler`, :mod:`~.attention_state`,
:mod:`~.drafter`, :mod:`~.moe_comm_method`, :mod:`~.moe_comm`,
:mod:`~.layer_ops`, :mod:`~.graph`, :mod:`~.attention_backend`,
:mod:`~.attention_mask`, :mod:`~.rejection_sampler`; :mod:`~.settings` checks a
plugin's settings model (family ``settings``). Nothing here starts a
vLLM engine; factories get small real vLLM configs
(:mod:`~.environment`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from ascend_kernel.conformance.results import ConformanceReport

#: name -> module that defines it; imported on first use, so that loading the pytest plugin
#: (every pytest run where ascend-kernel is installed) imports neither torch nor vLLM
_LAZY = {
    "CheckResult": "results", "ConformanceError": "results", "ConformanceReport": "results",
    "ImplementationCase": "runner", "UnknownPluginError": "runner", "implementation_cases": "runner",
    "run_conformance": "runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_plugin(*plugins: str, distributed: bool = False, cache_dir: str | Path | None = None,
                 raise_on_failure: bool = True) -> "ConformanceReport":
    """Run the kit over ``plugins`` (every loaded plugin when none is named).

    Raises :class:`ConformanceError` (an ``AssertionError``) listing every
    broken contract unless ``raise_on_failure`` is False; returns the report.
    """
    from ascend_kernel.conformance.runner import run_conformance

    names: Sequence[str] | None = list(plugins) if plugins else None
    report = run_conformance(names, distributed=distributed, cache_dir=cache_dir)
    if raise_on_failure:
        report.raise_for_failures()
    return report


__all__ = [
    "CheckResult", "ConformanceError", "ConformanceReport", "ImplementationCase", "UnknownPluginError",
    "check_plugin", "implementation_cases", "run_conformance",
]

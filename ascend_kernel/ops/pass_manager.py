"""The post-grad passes over the seam ops: the platform's pass manager, and the pass every kernel compile runs.

The passes themselves are the ``fusion_pass`` table of this process's kernel
(built at resolution; a plugin family). They reach every compile path the
kernel uses:

* vLLM's own backend (``VLLM_COMPILE``: ACL graph pieces on an NPU): the
  platforms name :class:`SeamPassManager` in ``get_pass_manager_cls``; it is
  vLLM's post-grad pass manager with :class:`SeamFusionPasses` first, on the
  functional graph, before vLLM's clean-up and re-inplacing;
* vLLM-CPU's default compilation (Dynamo once, then plain ``"inductor"``
  with ``compilation_config.inductor_compile_config`` as its options): the
  graph plugin puts a :class:`SeamFusionPasses` under inductor's
  ``post_grad_custom_post_pass`` there (a recorded config change; vLLM's
  config hash leaves that key out by design);
* the kernel's own per-size artifacts (cpu-graph's ``standalone_compile``):
  the same key in the inductor config patch around each compile.

Matches are counted by each pass object, summed over every graph this
process compiled; :func:`fusion_report` is the report's ``fusion`` object.
"""

from __future__ import annotations

import hashlib
from typing import Any

from torch import fx
from vllm.compilation.passes.inductor_pass import InductorPass
from vllm.compilation.passes.pass_manager import PostGradPassManager

#: inductor's config key for a post-grad pass of one's own (also vLLM's platform default ``pass_key``)
POST_GRAD_KEY = "post_grad_custom_post_pass"
FAMILY = "fusion_pass"


def _kernel() -> Any:
    from ascend_kernel import kernel as kernel_mod

    try:
        return kernel_mod.current()
    except Exception:  # no engine in this process (a bare compile): nothing to run
        return None


def fusion_passes(kernel: Any = None) -> list[Any]:
    """The built passes of a kernel's (this process's) ``fusion_pass`` table, in order (each once)."""
    kernel = kernel if kernel is not None else _kernel()
    plan = getattr(kernel, "plan", None)
    table = plan.tables.get(FAMILY, {}) if plan is not None else {}
    seen: dict[int, Any] = {}
    for obj in table.values():
        seen.setdefault(id(obj), obj)
    return list(seen.values())


class SeamFusionPasses(InductorPass):
    """Every enabled fusion pass over one post-grad graph (an inductor custom pass, with a uuid for its cache)."""

    def __call__(self, graph: fx.Graph) -> None:
        changed = sum(fusion_pass(graph) for fusion_pass in fusion_passes())
        if changed:
            graph.lint()

    def __repr__(self) -> str:  # shown in config-change records: no address
        return "SeamFusionPasses()"

    def uuid(self) -> str | None:
        """None while a pass is enabled: inductor then compiles the graph rather than load it from its FX graph
        cache, where the passes would not run, so each pass's ``matches`` counts every graph this process
        compiled (at the price of that cache for these graphs); with no pass, a stable key."""
        passes = fusion_passes()
        if passes:
            return None
        state = sorted(f"{type(p).__module__}.{type(p).__qualname__}:{getattr(p, 'key', '')}" for p in passes)
        sources = InductorPass.hash_source(self, *(type(p) for p in passes))
        return hashlib.sha256(("|".join(state) + sources).encode()).hexdigest()


class SeamPassManager(PostGradPassManager):
    """vLLM's post-grad pass manager with the kernel's fusion passes first (the platforms' ``get_pass_manager_cls``)."""

    def configure(self, config: Any) -> None:
        super().configure(config)
        self.passes.insert(0, SeamFusionPasses())

    def uuid(self) -> Any:
        """As :meth:`SeamFusionPasses.uuid`: no inductor cache key while a fusion pass is enabled."""
        return None if fusion_passes() else super().uuid()


def fusion_report(kernel: Any) -> list[dict[str, Any]]:
    """Per pass ``{name, enabled, matches, ...}``: the built passes' own account; the others say why they are off."""
    record = next((r for r in reversed(getattr(kernel, "records", [])) if r.family == FAMILY), None)
    plan = getattr(kernel, "plan", None)
    built = plan.tables.get(FAMILY, {}) if plan is not None else {}
    report = []
    for candidate in record.candidates if record is not None else ():
        if candidate.name in built:
            report.append({**built[candidate.name].describe(), "name": candidate.name})
        else:
            report.append({"name": candidate.name, "enabled": False, "matches": 0, "why": candidate.reason})
    return report

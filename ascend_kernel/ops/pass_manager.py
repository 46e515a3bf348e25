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
import inspect
from typing import Any

from torch import fx
from vllm.compilation.passes.inductor_pass import InductorPass
from vllm.compilation.passes.pass_manager import PostGradPassManager

from ascend_kernel.ops import opaque

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
    """Every enabled fusion pass over one post-grad graph (an inductor custom pass; its uuid is inductor's cache key)."""

    def __call__(self, graph: fx.Graph) -> None:
        changed = sum(fusion_pass(graph) for fusion_pass in fusion_passes())
        if changed:
            graph.lint()

    def __repr__(self) -> str:  # shown in config-change records: no address
        return "SeamFusionPasses()"

    def uuid(self) -> str:
        """Inductor's cache key for this pass: the enabled passes (their classes, device kind and order) and the
        source of the modules that define them and the seam's graph ops, so a graph rewritten by other passes, or by an edited pass, is
        never served from the cache. A graph inductor does serve from its cache was rewritten by these very
        passes when it was first compiled; the passes do not run on it again, so ``matches`` counts the graphs
        this process compiled (a test that counts them compiles with inductor's FX graph cache off)."""
        passes = fusion_passes()
        state = [f"{type(p).__module__}.{type(p).__qualname__}@{getattr(p, 'device_kind', '')}" for p in passes]
        modules = sorted({inspect.getmodule(type(p)) for p in passes} | ({opaque} if passes else set()),
                         key=lambda m: m.__name__)
        sources = InductorPass.hash_source(*(inspect.getsource(m) for m in modules))
        return hashlib.sha256(("|".join(state) + sources).encode()).hexdigest()


class SeamPassManager(PostGradPassManager):
    """vLLM's post-grad pass manager with the kernel's fusion passes first (the platforms' ``get_pass_manager_cls``)."""

    def configure(self, config: Any) -> None:
        super().configure(config)
        self.passes.insert(0, SeamFusionPasses())


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

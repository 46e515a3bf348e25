"""Contract of the ``graph`` family: capture sizes, and padding that never shrinks a batch.

The mode is built under a config that asks for capture sizes
(:data:`~ascend_kernel.conformance.environment.GRAPH_CAPTURE_SIZES`), then:

* ``interface``: ``capture_sizes``, ``capture``, ``padded_num_tokens`` and the
  platform's static-graph answers (``supports_static_graph``, ``static_graph_wrapper_cls``) are callable;
* ``static-graph``: ``supports_static_graph()`` is a bool and, when True,
  ``static_graph_wrapper_cls()`` names an importable class;
* ``capture-sizes``: ``capture_sizes(vllm_config)`` is a list of positive whole numbers;
* ``pads-monotonically``: ``padded_num_tokens(n) >= n`` and non-decreasing in ``n``,
  for every ``n`` from 1 to twice the largest capture size;
* ``pads-to-captured-size``: ``padded_num_tokens(n)`` is ``n`` itself (run
  eagerly) or one of the captured sizes (the graph a batch replays).
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.environment import GRAPH_CAPTURE_SIZES
from ascend_kernel.conformance.results import Checks, Skip

FAMILY = "graph"
CONFIGS = ("llama-graphs",)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if built:
        check(*built[0], checks)


def check(found: Any, mode: Any, checks: Checks) -> None:
    state: dict[str, Any] = {}

    def interface() -> str:
        names = ("capture_sizes", "capture", "padded_num_tokens", "supports_static_graph", "static_graph_wrapper_cls")
        missing = [m for m in names if not callable(getattr(mode, m, None))]
        assert not missing, f"{type(mode).__name__} lacks {', '.join(missing)}"
        return ", ".join(names)

    def static_graph() -> str:
        supported = mode.supports_static_graph()
        assert isinstance(supported, bool), f"supports_static_graph() returned {supported!r}, not a bool"
        if not supported:
            return "no static graphs"
        from vllm.utils.import_utils import resolve_obj_by_qualname

        path = mode.static_graph_wrapper_cls()
        cls = resolve_obj_by_qualname(path)
        assert isinstance(cls, type), f"static_graph_wrapper_cls() = {path!r} is not a class"
        return path

    def capture_sizes() -> str:
        sizes = mode.capture_sizes(found.ctx.vllm_config)
        sizes = list(sizes)
        bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
        assert not bad, f"capture_sizes returned {sizes}: {bad} are not positive whole numbers"
        state["sizes"] = sizes
        return f"{sizes}"

    def pads_monotonically() -> str:
        top = 2 * max([*state.get("sizes", []), *GRAPH_CAPTURE_SIZES])
        padded = []
        for n in range(1, top + 1):
            p = mode.padded_num_tokens(n)
            assert isinstance(p, int) and not isinstance(p, bool), f"padded_num_tokens({n}) returned {p!r}"
            assert p >= n, f"padded_num_tokens({n}) = {p} < {n}: the batch would be cut"
            if padded:
                assert p >= padded[-1], f"padded_num_tokens({n}) = {p} < padded_num_tokens({n - 1}) = {padded[-1]}"
            padded.append(p)
        state["padded"] = padded
        return f"n = 1..{top}"

    def pads_to_captured() -> str:
        if "padded" not in state or "sizes" not in state:
            raise Skip("needs contracts 'capture-sizes' and 'pads-monotonically' to pass first")
        sizes = set(state["sizes"])
        for n, p in enumerate(state["padded"], start=1):
            assert p == n or p in sizes, \
                f"padded_num_tokens({n}) = {p} is neither {n} nor a captured size {sorted(sizes)}"
        return "every padded size is the batch's own or a captured one"

    checks.run("interface", interface)
    checks.run("static-graph", static_graph)
    checks.run("capture-sizes", capture_sizes)
    checks.run("pads-monotonically", pads_monotonically)
    checks.run("pads-to-captured-size", pads_to_captured)

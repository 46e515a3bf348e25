"""The fusion passes: patterns over the seam ops in a traced (post-grad) FX graph, each replaced by one fused seam op.

A pass walks the graph's nodes (no example inputs to trace, no pattern
compiled ahead): the seam ops are registered ops, so each is one node whose
arguments (provider handle, eps, head size) are right there to check. Where a
candidate fails a condition the pass counts the reason (``skipped``), which
the report shows next to the matches. Every replacement is the fused op's
contract (:mod:`ascend_kernel.ops.fused_ops`): the composition of the nodes it
removes, so the graph computes the same values.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any, Callable, Iterable

import torch
from torch import fx

_K = torch.ops.ascend_kernel
_ATEN = torch.ops.aten
_VIEWS = {_ATEN.view.default, _ATEN.reshape.default}
#: the dtypes the Ascend fused norm kernels take (npu_add_rms_norm_quant / _dynamic_quant)
NPU_NORM_DTYPES = (torch.float16, torch.bfloat16)


def _op(name: str) -> Any:
    """``ascend_kernel::name`` overload, once the seam registered it (the reference provider registers them all)."""
    from ascend_kernel.ops import get_ops

    get_ops("reference", "cpu")
    return getattr(_K, name).default


def _item(node: fx.Node, index: int) -> fx.Node | None:
    """The ``getitem(node, index)`` user of a tuple-returning node, if any."""
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] == index:
            return user
    return None


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _dtype(node: Any) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return getattr(val, "dtype", None)


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if val is not None and hasattr(val, "shape") else None


def _tuple_node(graph: fx.Graph, before: fx.Node, target: Any, args: tuple[Any, ...],
                outputs: Iterable[fx.Node | None]) -> list[fx.Node]:
    """Insert ``target(*args)`` before ``before`` and one getitem per output, each with its old node's meta."""
    outputs = list(outputs)
    with graph.inserting_before(before):
        fused = graph.call_function(target, args)
        fused.meta["val"] = tuple(o.meta.get("val") if o is not None else None for o in outputs)
        items = []
        for index, old in enumerate(outputs):
            item = graph.call_function(operator.getitem, (fused, index))
            if old is not None:
                item.meta.update(old.meta)
                old.replace_all_uses_with(item)
            items.append(item)
    return items


class FusionPass:
    """One pass: its name, the setting that forces it off, and what it did in this process."""

    name = ""
    setting = ""
    description = ""

    def __init__(self, device_kind: str = "cpu") -> None:
        self.device_kind = device_kind
        self.matches = 0
        self.graphs = 0
        self.skipped: Counter[str] = Counter()

    def __call__(self, graph: fx.Graph) -> int:
        """Rewrite ``graph`` in place; returns (and adds to :attr:`matches`) how many patterns it replaced."""
        found = self.apply(graph)
        if found:
            graph.eliminate_dead_code()
        self.matches += found
        self.graphs += 1
        return found

    def apply(self, graph: fx.Graph) -> int:
        raise NotImplementedError

    def skip(self, why: str) -> int:
        self.skipped[why] += 1
        return 0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "enabled": True, "matches": self.matches, "graphs": self.graphs,
                "skipped": dict(self.skipped)}


class NormQuantPass(FusionPass):
    """``add_rms_norm`` -> [+ bias] -> ``quantize`` / ``dynamic_quant``  =>  ``add_rms_norm_quant`` / ``_dynamic_quant``."""

    name = "norm_quant"
    setting = "fuse_norm_quant"
    description = "add_rms_norm + quantize / dynamic_quant -> add_rms_norm_quant / add_rms_norm_dynamic_quant"

    def apply(self, graph: fx.Graph) -> int:
        norm = _op("add_rms_norm")
        return sum(self._one(graph, node) for node in list(graph.nodes)
                   if node.op == "call_function" and node.target is norm)

    def _one(self, graph: fx.Graph, node: fx.Node) -> int:
        provider, x, residual, weight, eps = node.args
        normed = _item(node, 0)
        user = _only_user(normed) if normed is not None else None
        if user is None:
            return 0  # a norm feeding something else than one quantize: not this pattern
        bias = None
        if user.target is _ATEN.add.Tensor and normed in user.args and len(user.users) == 1:
            other = user.args[1] if user.args[0] is normed else user.args[0]
            if isinstance(other, fx.Node) and _shape(other) == _shape(weight):
                bias, user = other, next(iter(user.users))
        static, dynamic = _op("quantize"), _op("dynamic_quant")
        if user.target not in (static, dynamic):
            return 0
        if user.args[0] != provider:
            return self.skip("the norm and the quantize run on different ops providers")
        if self.device_kind == "npu" and _dtype(x) not in NPU_NORM_DTYPES:
            return self.skip(f"dtype {_dtype(x)}: the NPU's fused norm-quant kernels take float16/bfloat16")
        if user.target is static:
            _, _, inv_scale, offset = user.args
            _tuple_node(graph, user, _op("add_rms_norm_quant"),
                        (provider, x, residual, weight, eps, inv_scale, offset, bias), (user, _item(node, 1)))
        else:
            _tuple_node(graph, user, _op("add_rms_norm_dynamic_quant"), (provider, x, residual, weight, eps, bias),
                        (_item(user, 0), _item(user, 1), _item(node, 1)))
        return 1


class QkNormRopePass(FusionPass):
    """``rms_norm`` of the q heads and of the k heads -> ``rope``  =>  ``qk_norm_rope`` (Qwen3's q/k norms)."""

    name = "qknorm_rope"
    setting = "fuse_qknorm_rope"
    description = "per-head q/k rms_norm + rope -> qk_norm_rope"

    def apply(self, graph: fx.Graph) -> int:
        rope = _op("rope")
        return sum(self._one(graph, node) for node in list(graph.nodes)
                   if node.op == "call_function" and node.target is rope)

    def _normed_source(self, arg: Any) -> tuple[fx.Node, fx.Node, Any, float] | str:
        """``arg = view(rms_norm(view(src), weight, eps)[0])`` -> (src, norm node, weight, eps), or why not."""
        if not isinstance(arg, fx.Node) or arg.target not in _VIEWS or len(arg.users) != 1:
            return "the rotary input is not a view of a norm's output"
        item = arg.args[0]
        if not (isinstance(item, fx.Node) and item.target is operator.getitem and item.args[1] == 0
                and getattr(item.args[0], "target", None) is _op("rms_norm") and len(item.users) == 1):
            return "the rotary input is not a per-head rms_norm"
        norm = item.args[0]
        heads = norm.args[1]
        rstd = _item(norm, 1)
        if rstd is not None and rstd.users:
            return "the norm's rstd is used elsewhere"
        if not (isinstance(heads, fx.Node) and heads.target in _VIEWS):
            return "the norm's input is not a per-head view"
        return heads.args[0], norm, norm.args[2], norm.args[3]

    def _one(self, graph: fx.Graph, node: fx.Node) -> int:
        provider, positions, q, k, head_size, cache, neox = node.args
        sources = [self._normed_source(q), self._normed_source(k)]
        for found in sources:
            if isinstance(found, str):
                return 0 if "not a" in found else self.skip(found)
        (q_src, q_norm, q_weight, q_eps), (k_src, k_norm, k_weight, k_eps) = sources  # type: ignore[misc]
        if q_eps != k_eps:
            return self.skip(f"q and k norms differ in eps ({q_eps} vs {k_eps})")
        if _shape(q_weight) not in (None, (head_size,)) or _shape(k_weight) not in (None, (head_size,)):
            return self.skip(f"norm weights are not one head ({head_size}) wide")
        if _shape(q_src) != _shape(q) or _shape(k_src) != _shape(k):
            return self.skip("the normed heads do not reshape back to the rotary's input")
        if q_norm.args[0] != provider or k_norm.args[0] != provider:
            return self.skip("the norms and the rotary run on different ops providers")
        if self.device_kind == "npu" and _dtype(q_src) not in NPU_NORM_DTYPES:
            return self.skip(f"dtype {_dtype(q_src)}: the NPU kernels take float16/bfloat16")
        _tuple_node(graph, node, _op("qk_norm_rope"),
                    (provider, positions, q_src, k_src, q_weight, k_weight, q_eps, head_size, cache, neox),
                    (_item(node, 0), _item(node, 1)))
        return 1


class MulsAddPass(FusionPass):
    """``x * routed_scaling_factor + y``  =>  ``muls_add`` (DeepSeek's routed experts plus shared experts)."""

    name = "muls_add"
    setting = "fuse_muls_add"
    description = "x * routed_scaling_factor + y -> muls_add"

    def __init__(self, device_kind: str = "cpu", scale: float | None = None, provider: str = "reference") -> None:
        super().__init__(device_kind)
        self.scale = scale
        self.provider = provider

    def apply(self, graph: fx.Graph) -> int:
        if self.scale is None:
            return 0
        return sum(self._one(graph, node) for node in list(graph.nodes)
                   if node.op == "call_function" and node.target is _ATEN.add.Tensor)

    def _one(self, graph: fx.Graph, node: fx.Node) -> int:
        for mul, y in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            if (isinstance(mul, fx.Node) and mul.target is _ATEN.mul.Tensor and len(mul.users) == 1
                    and isinstance(mul.args[1], float) and mul.args[1] == self.scale and isinstance(y, fx.Node)):
                x = mul.args[0]
                if _shape(x) != _shape(node) or _shape(y) != _shape(node) or _dtype(x) != _dtype(y):
                    return self.skip("x and y differ in shape or dtype (a broadcast add)")
                with graph.inserting_before(node):
                    fused = graph.call_function(_op("muls_add"), (self.provider, x, y, self.scale))
                fused.meta.update(node.meta)
                node.replace_all_uses_with(fused)
                return 1
        return 0


PASSES: dict[str, Callable[..., FusionPass]] = {p.name: p for p in (NormQuantPass, QkNormRopePass, MulsAddPass)}

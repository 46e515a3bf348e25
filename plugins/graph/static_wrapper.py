"""A static-shape graph wrapper for hosts without device graphs (the ``cpu-graph`` mode).

vLLM wraps every piece of a piecewise-compiled model (and, in FULL mode, the
whole model) in the platform's static graph wrapper class and drives it with
the runtime mode and batch descriptor that its ``CudagraphDispatcher`` puts
in the forward context. On a GPU the wrapper records a CUDA graph per batch
descriptor; a CPU has no graphs, so :class:`StaticShapeWrapper` records the
next best thing: at capture it compiles the piece for that one shape
(``torch.compile(dynamic=False)``, inductor by default); a replay calls that
artifact, so no model Python and no shape-generic code runs.

What a captured graph would demand of the code around it, the artifact
demands too (so code that is capture-safe here is capture-safe on an NPU):

* every tensor input from outside the model's pieces (the runner's
  persistent buffers, the KV cache, the weights) must be at the address it
  had at capture (:class:`MovedInputError` names the one that moved);
* what the model hands back (the last piece's result, or the whole model's
  in FULL mode) lives in buffers owned by the capture, at the same addresses
  on every replay, overwritten by the next one.

What passes from one piece to the next (hidden states, the buffer attention
writes into) never leaves the model: on a device it sits in the graph pool,
where no caller can move it. Here an inner piece returns its artifact's
fresh tensors as they are, and those inputs of the next piece are left out
of the address check; copying them into fixed buffers cost a few per cent
of a tiny model's decode step and checked nothing a caller controls.
A runtime mode that is not the wrapper's runs the plain runnable, like
vLLM's ``CUDAGraphWrapper``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ascend_kernel.upstream import (dynamo_config_patch, dynamo_recompile_limit, standalone_compile, tree_flatten,
                                    tree_unflatten)

from ascend_kernel_plugins.graph.piece_wrapper import (  # noqa: F401 - MovedInputError is part of this API
    CapturedAddresses, MovedInputError, PieceWrapper, piece_input_names)


@dataclass
class CaptureBook:
    """What this process's wrappers captured and replayed (one book per process, read by the report).

    Only the wrappers that vLLM marks as the first of a model's pieces count
    replays and fallbacks, so each forward pass counts once.
    """

    #: torch.compile backend of the static artifacts ("inductor"; "aot_eager" compiles faster, runs slower)
    backend: str = "inductor"
    captured_sizes: set[int] = field(default_factory=set)
    replays: Counter = field(default_factory=Counter)
    eager_fallbacks: int = 0
    artifacts: int = 0
    compile_s: float = 0.0
    #: True once capture is over: forward passes from then on are counted
    serving: bool = False
    #: storages an inner piece's capture returned (kept alive by its entry): a later piece's input in one of
    #: them is carried from piece to piece, not a caller's buffer, and is left out of the address check
    carried: set[int] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {"captured_sizes": sorted(self.captured_sizes),
                "replays": {str(k): v for k, v in sorted(self.replays.items())},
                "eager_fallbacks": self.eager_fallbacks, "artifacts": self.artifacts,
                "artifact_backend": self.backend, "artifact_compile_s": round(self.compile_s, 3)}


BOOK = CaptureBook()


def _mirror(outputs: list[Any]) -> list[Any]:
    """Buffers of our own shaped like ``outputs``, aliasing each other exactly as the outputs do.

    A piece may return a buffer and a view of it (attention writes its result
    into one, the next piece reads the other); one static storage per distinct
    output storage keeps that true for the copies.
    """
    storages: dict[int, torch.UntypedStorage] = {}
    mirrored: list[Any] = []
    for out in outputs:
        if not isinstance(out, torch.Tensor):
            mirrored.append(out)
            continue
        storage = out.untyped_storage()
        key = storage.data_ptr()
        if key not in storages:
            storages[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device=out.device).untyped_storage()
        view = torch.empty(0, dtype=out.dtype, device=out.device)
        view.set_(storages[key], out.storage_offset(), out.size(), out.stride())
        mirrored.append(view.copy_(out))
    return mirrored


class StaticEntry:
    """One captured shape: the artifact, the input addresses it was captured with, how it returns its result.

    The model's outermost result (``static_outputs``) is copied into the
    entry's own buffers, and a replay returns the same result object every
    time. vLLM's pieces return one tensor or a flat tuple or list of tensors;
    for those the copy pairs and the result are fixed at capture, so a
    replay does no pytree walk (two walks per piece were about a tenth of a
    tiny model's decode step). Anything nested goes through the walk. An
    artifact compiled for one shape returns the same structure every call,
    so the form is decided once, at capture. An inner piece's replay returns
    the artifact's result as it is.
    """

    __slots__ = ("descriptor", "artifact", "addresses", "static_outputs", "outputs", "spec", "flat", "copies",
                 "result", "produced")

    def __init__(self, descriptor: Any, artifact: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], result: Any, static_outputs: bool = True,
                 carried: set[int] | frozenset[int] = frozenset()) -> None:
        self.descriptor = descriptor
        self.artifact = artifact
        self.addresses = CapturedAddresses(args, kwargs, carried)
        self.static_outputs = static_outputs
        flat, self.spec = tree_flatten(result)
        #: the capture's own result: mirrored buffers (returned by every replay), or the capture's tensors,
        #: held so that the storages the book names as carried are not reused while it names them
        self.outputs = _mirror(flat) if static_outputs else flat
        self.result = tree_unflatten(self.outputs, self.spec)
        self.produced = {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor)}
        #: the result is a tensor (None) or a flat tuple/list of leaves (its type); anything else walks the tree
        self.flat: type | None | bool = None if isinstance(result, torch.Tensor) else (
            type(result) if type(result) in (tuple, list) and len(result) == len(flat) else False)
        #: (index in the artifact's result, buffer) for every tensor output the replay copies
        self.copies = tuple((i, out) for i, out in enumerate(self.outputs) if isinstance(out, torch.Tensor))

    def replay(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fresh = self.artifact(*args, **kwargs)
        if not self.static_outputs:
            return fresh
        if self.flat is None:
            if fresh is not self.result:
                self.result.copy_(fresh)
            return self.result
        if self.flat is False:
            fresh, _ = tree_flatten(fresh)
            for static, out in zip(self.outputs, fresh):
                if isinstance(static, torch.Tensor) and static is not out:
                    static.copy_(out)
            return tree_unflatten(self.outputs, self.spec)
        for i, static in self.copies:
            out = fresh[i]
            if static is not out:
                static.copy_(out)
        return self.result if self.flat is tuple else list(self.result)  # a list is the caller's to change


def _target_of(runnable: Any) -> tuple[Callable[..., Any], Callable[[Any], Any], list[str] | None]:
    """What to compile, how to shape its result like the runnable's, and the names of its inputs.

    A piece of vLLM's piecewise backend holds its FX graph: compiling that
    graph (not the dispatching object around it) gives one artifact with no
    Python of vLLM's in it. Anything else is compiled as it is.
    """
    graph = getattr(runnable, "graph", None)
    if isinstance(graph, torch.fx.GraphModule):
        names = piece_input_names(runnable)
        returns_tuple = getattr(runnable, "returns_tuple", True)

        def shaped(out: Any) -> Any:
            return out[0] if not returns_tuple and isinstance(out, (tuple, list)) else out

        return graph, shaped, names
    return runnable, (lambda out: out), None


def _compile_static(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    backend: str) -> Callable[..., Any]:
    """One shape's artifact: inductor's standalone compile of an FX graph at the inputs' exact shapes.

    A standalone artifact is called without Dynamo's frame hook and guards (a
    replay is a plain call into generated code); anything that is not an FX
    graph, or another backend, goes through ``torch.compile(dynamic=False)``; a
    whole model is traced once and its graph compiled the same way
    (:mod:`~ascend_kernel_plugins.graph.whole_model`).
    """
    if isinstance(target, torch.fx.GraphModule) and not kwargs:
        if backend == "inductor":
            from ascend_kernel_plugins.graph.inductor_fixups import kernel_inductor_options

            with kernel_inductor_options():
                return standalone_compile()(target, list(args), dynamic_shapes="from_example_inputs")
        return torch.compile(target, backend=backend, dynamic=False)
    if isinstance(target, torch.nn.Module):  # the whole model (full_decode_only): its graph, called without Dynamo
        from ascend_kernel_plugins.graph.whole_model import compile_whole_model

        return compile_whole_model(target, args, kwargs, backend)
    from ascend_kernel_plugins.graph.inductor_fixups import kernel_options

    options = kernel_options() if backend == "inductor" else None
    return torch.compile(target, backend=backend, dynamic=False, fullgraph=True, options=options)


class StaticShapeWrapper(PieceWrapper):
    """vLLM's static graph wrapper interface (``CUDAGraphWrapper``'s constructor), captured per batch descriptor."""

    def __init__(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any,
                 cudagraph_options: Any = None, book: CaptureBook | None = None) -> None:
        from vllm.config import CUDAGraphMode

        if runtime_mode == CUDAGraphMode.NONE:
            raise ValueError("a static graph wrapper needs a runtime mode that captures (PIECEWISE or FULL)")
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        #: vLLM marks the first piece of a model (it logs); that one counts the book's replays
        self.counts = cudagraph_options is None or bool(getattr(cudagraph_options, "debug_log_enable", True))
        #: vLLM marks the last piece (its output may be weakly held); that one, or a whole model, hands the
        #: model's result back and keeps it in buffers of its own
        self.outermost = cudagraph_options is None or bool(getattr(cudagraph_options, "weak_ref_output", True))
        self.book = book if book is not None else BOOK
        self.entries: dict[Any, StaticEntry] = {}
        self._target, self._shaped, self.input_names = _target_of(runnable)

    def clear_graphs(self) -> None:
        for entry in self.entries.values():
            if not entry.static_outputs:
                self.book.carried -= entry.produced
        super().clear_graphs()

    def _ran_plainly(self) -> None:
        if self.counts and self.book.serving:
            self.book.eager_fallbacks += 1

    def _replay(self, entry: StaticEntry, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entry.addresses.check(args, kwargs, self.input_names, descriptor)
        if self.counts:
            self.book.replays[descriptor.num_tokens] += 1
        return entry.replay(args, kwargs)

    def _capture(self, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Compile the runnable for this one shape and keep it (only while vLLM's capture loop runs)."""
        from vllm.compilation.monitor import validate_cudagraph_capturing_enabled

        validate_cudagraph_capturing_enabled()
        started = time.perf_counter()
        if not isinstance(self._target, torch.fx.GraphModule):
            # one plain pass first: layers that finish their set-up on their first call (vLLM's MoE quant
            # config) must do it before the trace, not inside it
            self.runnable(*args, **kwargs)
        # one artifact per size of the same piece: Dynamo keeps them as entries of one code object, so its
        # recompile limit is raised for this compile only (restored after: the process's limit is not ours)
        with dynamo_config_patch(recompile_limit=max(dynamo_recompile_limit(), len(self.entries) + 8)):
            compiled = _compile_static(self._target, args, kwargs, self.book.backend)
            shaped = self._shaped
            result = shaped(compiled(*args, **kwargs))

        def artifact(*a: Any, **kw: Any) -> Any:
            return shaped(compiled(*a, **kw))

        book = self.book
        entry = self.entries[descriptor] = StaticEntry(descriptor, artifact, args, kwargs, result,
                                                       static_outputs=self.outermost, carried=book.carried)
        if not self.outermost:
            book.carried |= entry.produced
        book.compile_s += time.perf_counter() - started
        book.artifacts += 1
        book.captured_sizes.add(descriptor.num_tokens)
        return tree_unflatten(entry.outputs, entry.spec)

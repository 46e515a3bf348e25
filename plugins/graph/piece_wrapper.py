"""What every static-graph wrapper shares: vLLM's wrapper contract around one piece of the model.

vLLM wraps each compiled piece (or the whole model) in the platform's static
graph wrapper class and drives it through the forward context: the runtime
mode says whether this forward pass replays graphs of the wrapper's kind,
and the batch descriptor names the captured shape. A wrapper forwards
attribute reads to the piece it wraps (vLLM reads them), runs the piece
plainly when the forward pass is not its mode, captures a descriptor on
first sight (vLLM's capture loop) and replays it afterwards. Subclasses say
how to capture and replay (:meth:`_capture`, :meth:`_replay`).

Also shared: the capture invariant. A captured graph reads its inputs by
address, so every wrapper records each tensor input's address at capture and
checks it before a replay (:func:`check_input_addresses`), naming the input
that moved (vLLM checks this only in debug mode).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from typing import Any, Callable, Iterator

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available


class MovedInputError(RuntimeError):
    """A replay got a tensor input at another address than at capture."""


def input_addresses(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> list[tuple[int | str, int]]:
    """(position or keyword, data_ptr) of every tensor input, as a captured graph reads them.

    vLLM calls a piece positionally and the whole model by keyword
    (``input_ids=``, ``positions=``, ...): both are recorded.
    """
    found: list[tuple[int | str, int]] = [(i, a.data_ptr()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if kwargs:
        found.extend((k, v.data_ptr()) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return found


def check_input_addresses(addresses: list[tuple[int | str, int]], args: tuple[Any, ...], names: list[str] | None,
                          descriptor: Any, kwargs: dict[str, Any] | None = None) -> None:
    """Raise :class:`MovedInputError` naming the first tensor input not at its captured address."""
    for key, captured in addresses:
        if isinstance(key, str):
            value = (kwargs or {}).get(key)
            name, where = key, f"keyword {key}"
        else:
            value = args[key] if key < len(args) else None
            name = names[key] if names is not None and key < len(names) else "?"
            where = f"{key} ({name})"
        now = value.data_ptr() if isinstance(value, torch.Tensor) else None
        if now != captured:
            at = f"now at {now:#x}" if now is not None else "now missing"
            raise MovedInputError(
                f"static graph input {where} moved since capture of {descriptor}: "
                f"captured at {captured:#x}, {at}. Captured graphs read their inputs by "
                "address; write per-step inputs into the persistent buffers in place instead of rebinding them.")


class CapturedAddresses:
    """The tensor inputs' addresses at capture, compared as one tuple before each replay.

    The check runs before every replay of every piece, so its common case (nothing
    moved) is one tuple built from ``data_ptr()`` reads and one comparison; only a
    mismatch walks the inputs one by one to name the one that moved
    (:func:`check_input_addresses`).
    """

    __slots__ = ("addresses", "positions", "keywords", "expected")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                 exempt_storages: set[int] | frozenset[int] = frozenset()) -> None:
        """Record the tensor inputs' addresses, leaving out those in ``exempt_storages`` (by storage address)."""
        self.addresses = input_addresses(args, kwargs)
        if exempt_storages:
            values = {**dict(enumerate(args)), **(kwargs or {})}
            self.addresses = [(key, address) for key, address in self.addresses
                              if values[key].untyped_storage().data_ptr() not in exempt_storages]
        self.positions = tuple(key for key, _ in self.addresses if not isinstance(key, str))
        self.keywords = tuple(key for key, _ in self.addresses if isinstance(key, str))
        self.expected = tuple(address for _, address in self.addresses)

    def _now(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[int, ...] | None:
        try:
            now = [args[i].data_ptr() for i in self.positions]
            if self.keywords:
                now.extend(kwargs[k].data_ptr() for k in self.keywords)  # type: ignore[index]
        except (IndexError, KeyError, TypeError, AttributeError):
            return None  # an input is missing or no longer a tensor: the slow path names it
        return tuple(now)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None, names: list[str] | None,
              descriptor: Any) -> None:
        """Raise :class:`MovedInputError` naming the first tensor input not at its captured address."""
        if self._now(args, kwargs) != self.expected:
            check_input_addresses(self.addresses, args, names, descriptor, kwargs)


def piece_input_names(runnable: Callable[..., Any]) -> list[str] | None:
    """Names of a runnable's positional inputs: a vLLM piece's FX placeholders, else its signature."""
    graph = getattr(runnable, "graph", None)
    if isinstance(graph, torch.fx.GraphModule):
        graph = graph.graph
    if isinstance(graph, torch.fx.Graph):
        return [n.name for n in graph.nodes if n.op == "placeholder"]
    try:
        params = inspect.signature(runnable).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@contextlib.contextmanager
def gc_collect_skipped() -> Iterator[None]:
    """``gc.collect`` does nothing inside (a capture context collects on entry; later pieces need not)."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect


class PieceWrapper:
    """Dispatch of one wrapped piece by the forward context's runtime mode and batch descriptor."""

    runnable: Callable[..., Any]
    runtime_mode: Any
    entries: dict[Any, Any]

    def __getattr__(self, key: str) -> Any:
        runnable = self.__dict__.get("runnable")
        if runnable is None or not hasattr(runnable, key):
            raise AttributeError(key)
        return getattr(runnable, key)

    def unwrap(self) -> Callable[..., Any]:
        runnable = self.runnable
        return runnable.unwrap() if hasattr(runnable, "unwrap") else runnable

    def clear_graphs(self) -> None:
        self.entries.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        context = get_forward_context()
        mode = context.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            self._ran_plainly()
            return self.runnable(*args, **kwargs)
        descriptor = context.batch_descriptor
        entry = self.entries.get(descriptor)
        if entry is None:
            return self._capture(descriptor, args, kwargs)
        return self._replay(entry, descriptor, args, kwargs)

    def _ran_plainly(self) -> None:
        """A forward pass not of this wrapper's mode ran the piece itself (counted where a wrapper reports it)."""

    def _capture(self, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _replay(self, entry: Any, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

"""A CPU stand-in for the NPU's device graphs, with the semantics a captured graph has.

It implements the device-graph seam of :class:`ascend_kernel.device.Device`
(``new_graph``, ``graph_pool_handle``, ``current_stream``, ``new_stream``,
``graph_capture``, ``weak_ref``, ``graph_task_group``, ``graph_task_update``)
so code written against the seam runs here instead of on torch.npu.

Semantics, as on the device:

* capture records each op issued inside the capture context as a task (a
  torch dispatch mode sees every aten op, and each seam op registered as a
  torch op as one call): the op, its argument tensors (the tensors themselves,
  so a replay reads what lies at the captured addresses) and its outputs.
  Allocations are not tasks (their memory is fixed at capture). A host read of
  a tensor value (``.item()``) inside a capture is an error, as on an NPU;
* replay re-runs the recorded tasks in order and writes each result into the
  tensor the task produced at capture; it does not call the captured Python;
* params an op holds by value (``ascend_kernel.ops.graph_ops.HOST_PARAMS``,
  e.g. paged attention's sequence lengths) are snapshotted when the task is
  issued and a replay runs with the snapshot, as the device does;
* a task group marks the tasks issued inside it (on the capturing stream;
  ``graph.groups`` lists them); an update re-issues its ops (recorded, not
  run) and replaces the group's tasks, which must be the same ops.

Stricter than the device on purpose: a replay whose held value differs from
the tensor it was issued from (the batch's lengths changed in place and no
update was issued) raises :class:`StaleTaskParamError` instead of silently
computing with the old lengths.

Kept under tests/: only tests use it; it is a tool for checking the ACL graph
code on a CPU, not a graph mode to serve with.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ascend_kernel.device import GraphTaskGroup
from ascend_kernel.ops.graph_ops import HOST_PARAMS

aten = torch.ops.aten
#: allocations get their memory at capture; a replay does not re-run them
ALLOCATIONS = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
HOST_READS = {aten._local_scalar_dense}


class CaptureError(RuntimeError):
    """Something a device graph capture does not allow."""


class StaleTaskParamError(RuntimeError):
    """A replay would run a task with a held param that no longer matches the batch's."""


class TaskUpdateError(RuntimeError):
    """An update that does not fit the group it updates."""


def _param_slot(op: Any, name: str, args: tuple[Any, ...]) -> int | str:
    names = [a.name for a in op._schema.arguments]
    position = names.index(name)
    return position if position < len(args) else name


@dataclass
class Task:
    """One recorded op: what it was issued with, what it produced, the params it holds by value."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[Any]
    held: dict[str, tuple[int | str, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def issued(cls, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> "Task":
        task = cls(op, tuple(args), dict(kwargs), tree_flatten(result)[0])
        for name in HOST_PARAMS.get(op._schema.name, ()):
            slot = _param_slot(op, name, args)
            value = args[slot] if isinstance(slot, int) else kwargs[slot]
            task.held[name] = (slot, value.detach().clone())
        return task

    def _live(self, slot: int | str) -> torch.Tensor:
        return self.args[slot] if isinstance(slot, int) else self.kwargs[slot]

    def check_fresh(self) -> None:
        for name, (slot, held) in self.held.items():
            live = self._live(slot)
            if not torch.equal(live, held):
                raise StaleTaskParamError(
                    f"replay of {self.op._schema.name}: its task holds {name}={held.tolist()} from when it was "
                    f"issued, but that tensor now holds {live.tolist()}. The device would run with the old values; "
                    "re-issue the task inside device.graph_task_update(...) before replaying")

    def run(self) -> None:
        args, kwargs = list(self.args), dict(self.kwargs)
        for slot, held in self.held.values():
            if isinstance(slot, int):
                args[slot] = held
            else:
                kwargs[slot] = held
        fresh = tree_flatten(self.op(*args, **kwargs))[0]
        for static, new in zip(self.outputs, fresh):
            if isinstance(static, torch.Tensor) and isinstance(new, torch.Tensor) and static.data_ptr() != new.data_ptr():
                static.copy_(new)


class _Recorder(TorchDispatchMode):
    """Records every op issued while active; runs it too unless ``execute`` is False (updates)."""

    def __init__(self, sink: Callable[[Task], None], execute: bool = True) -> None:
        super().__init__()
        self.sink = sink
        self.execute = execute

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in HOST_READS:
            raise CaptureError(f"{func} reads a device value on the host inside a graph capture/update; "
                               "read it before the captured region")
        if not self.execute:
            if func._schema.returns:
                raise TaskUpdateError(f"{func._schema.name} returns a new tensor: only kernels that write into "
                                      "given buffers can be re-issued inside a task update")
            self.sink(Task.issued(func, args, kwargs, None))
            return None
        result = func(*args, **kwargs)
        if func.overloadpacket not in ALLOCATIONS:
            self.sink(Task.issued(func, args, kwargs, result))
        return result


@dataclass(frozen=True)
class PoolToken:
    device_id: int
    index: int


@dataclass(frozen=True)
class Stream:
    name: str


@dataclass
class TaskGroupHandle:
    graph: "StandinGraph"
    start: int
    end: int


class StandinGraph:
    """A device graph: the tasks recorded at capture, re-run by :meth:`replay`."""

    def __init__(self, device: "RecordingGraphDevice") -> None:
        self.device = device
        self.tasks: list[Task] = []
        self.pool: PoolToken | None = None
        self.stream: Stream | None = None
        self.captured = False
        self.replays = 0
        #: the task groups marked in this graph, in capture order
        self.groups: list[TaskGroupHandle] = []

    def replay(self) -> None:
        if not self.captured:
            raise CaptureError("replay of a graph that was never captured")
        for task in self.tasks:  # all checked first: a stale graph runs nothing
            task.check_fresh()
        for task in self.tasks:
            task.run()
        self.replays += 1

    def ops(self) -> list[str]:
        return [t.op._schema.name for t in self.tasks]


class RecordingGraphDevice:
    """The device-graph seam on a CPU, recording what a device graph would hold."""

    kind = "standin"
    _ids = itertools.count()

    def __init__(self) -> None:
        self.id = next(self._ids)
        self.graphs: list[StandinGraph] = []
        self.pools: list[PoolToken] = []
        self.updates = 0
        self._capturing: StandinGraph | None = None
        self._stream = Stream("default")
        self.weak_refs: set[int] = set()

    def new_graph(self) -> StandinGraph:
        graph = StandinGraph(self)
        self.graphs.append(graph)
        return graph

    def graph_pool_handle(self) -> PoolToken:
        token = PoolToken(self.id, len(self.pools))
        self.pools.append(token)
        return token

    def current_stream(self) -> Stream:
        return self._stream

    def new_stream(self) -> Stream:
        return Stream(f"side-{len(self.graphs)}")

    def weak_ref(self, tensor: Any) -> Any:
        """The tensor itself: the recorded tasks keep the memory, as the graph pool does. Which tensors were
        asked for is kept (``weak_refs``, by id), so a test can check that code holds captured memory only
        through this seam, as it must on the device."""
        if isinstance(tensor, torch.Tensor):
            self.weak_refs.add(id(tensor))
        return tensor

    @contextlib.contextmanager
    def graph_capture(self, graph: StandinGraph, pool: Any = None, stream: Any = None) -> Iterator[None]:
        if self._capturing is not None:
            raise CaptureError("one capture at a time")
        if not isinstance(graph, StandinGraph) or graph.device is not self or graph.captured:
            raise CaptureError("capture needs a fresh graph from this device's new_graph()")
        if pool is not None and pool not in self.pools:
            raise CaptureError(f"pool {pool!r} is not a token from this device's graph_pool_handle()")
        graph.pool, graph.stream = pool, stream
        self._capturing = graph
        try:
            with _Recorder(graph.tasks.append):
                yield
        finally:
            self._capturing = None
        graph.captured = True

    @contextlib.contextmanager
    def graph_task_group(self, stream: Any) -> Iterator[GraphTaskGroup]:
        graph = self._capturing
        if graph is None:
            raise CaptureError("a task group is marked inside a graph capture")
        if stream != graph.stream:
            raise CaptureError(f"a task group is marked on the capturing stream {graph.stream!r}, not {stream!r}")
        group = GraphTaskGroup()
        start = len(graph.tasks)
        yield group
        group.handle = TaskGroupHandle(graph, start, len(graph.tasks))
        graph.groups.append(group.handle)

    @contextlib.contextmanager
    def graph_task_update(self, group: GraphTaskGroup, stream: Any) -> Iterator[None]:
        handle = group.handle
        if self._capturing is not None:
            raise TaskUpdateError("task updates are issued outside a capture")
        if not isinstance(handle, TaskGroupHandle) or handle.graph.device is not self:
            raise TaskUpdateError(f"{handle!r} is not a task-group handle of this device")
        issued: list[Task] = []
        with _Recorder(issued.append, execute=False):
            yield
        old = handle.graph.tasks[handle.start:handle.end]
        if [t.op for t in issued] != [t.op for t in old]:
            raise TaskUpdateError(f"an update must re-issue the group's ops {[t.op._schema.name for t in old]}; "
                                  f"got {[t.op._schema.name for t in issued]}")
        handle.graph.tasks[handle.start:handle.end] = issued
        self.updates += 1


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """vLLM's "a capture is running" switch, on for the block (its wrappers refuse to capture otherwise)."""
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled

    set_cudagraph_capturing_enabled(True)
    try:
        yield
    finally:
        set_cudagraph_capturing_enabled(False)

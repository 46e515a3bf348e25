"""The device seam: the one module that touches ``torch_npu`` / ``torch.npu``.

Everything device-specific the core and plugins need (which device, which
Ascend SoC, set_device, streams, events, synchronize, memory info, graph
objects, aligned raw buffers) goes through :class:`Device`. On an NPU host it
calls torch_npu; on CPU it uses plain torch; CUDA works where present. Tests
on a CPU host exercise the same code paths with the CPU answers.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ascend_kernel.settings import KernelSettings

#: ranges of ``torch_npu.npu.get_soc_version()`` per product family
_SOC_RANGES = (("310P", range(200, 206)), ("A2", range(220, 226)), ("A3", range(250, 256)))


@functools.cache
def _torch_npu() -> Any | None:
    try:
        import torch_npu  # noqa: F401

        return torch_npu
    except Exception:  # noqa: BLE001 - any failure means "no usable NPU stack"
        return None


def npu_available() -> bool:
    """True when torch_npu imports and at least one NPU is visible."""
    if _torch_npu() is None:
        return False
    try:
        return bool(torch.npu.is_available()) and torch.npu.device_count() > 0
    except Exception:  # noqa: BLE001
        return False


def _npu_soc() -> str | None:
    lib = _torch_npu()
    if lib is None:
        return None
    version = int(lib.npu.get_soc_version())
    return next((name for name, span in _SOC_RANGES if version in span), f"unknown({version})")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Facts about the device the kernel runs on, for ``supports(ctx)`` checks."""

    kind: str  # "npu" | "cpu" | "cuda"
    soc: str | None  # "A2" | "A3" | "310P" on NPU (or forced by settings), else None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "soc": self.soc}


def resolve_device_kind(settings: KernelSettings) -> str | None:
    """The device the kernel should run on, or None when it should stay off.

    ``auto`` never takes over a host without an NPU: installing ascend-kernel
    on a CUDA or plain CPU machine changes nothing unless asked.
    """
    if settings.device == "npu":
        return "npu"
    if settings.device == "cpu":
        return "cpu"
    return "npu" if npu_available() else None


def describe_device(settings: KernelSettings, kind: str) -> DeviceInfo:
    soc = settings.soc if settings.soc != "auto" else (_npu_soc() if kind == "npu" else None)
    return DeviceInfo(kind=kind, soc=soc)


@dataclass(slots=True)
class GraphTaskGroup:
    """Tasks captured into a device graph whose parameters may be re-issued before a replay.

    ``handle`` is the device's task-group handle (set when the group closes);
    ``event`` orders a replay after the latest update (the captured graph waits
    on it, an update records it).
    """

    handle: Any = None
    event: Any = None


class Device:
    """Device operations behind one interface (npu via torch_npu, cpu, cuda).

    The graph methods (``new_graph`` .. ``graph_task_update``) are the device-graph
    seam the ACL graph wrapper and the attention graph-params helper use; a test
    stand-in with the same methods takes torch.npu's place.
    """

    def __init__(self, kind: str) -> None:
        if kind not in ("npu", "cpu", "cuda"):
            raise ValueError(f"unknown device kind {kind!r}; allowed: npu, cpu, cuda")
        self.kind = kind
        self._mod = torch.npu if kind == "npu" else (torch.cuda if kind == "cuda" else None)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device(self.kind, index)

    def set_device(self, device: torch.device) -> None:
        getattr(self._mod, "set_device", lambda _: None)(device)

    def synchronize(self) -> None:
        getattr(self._mod, "synchronize", lambda: None)()

    def new_stream(self) -> Any | None:
        return self._mod.Stream() if self._mod is not None else None

    def new_event(self, enable_timing: bool = False) -> Any | None:
        return self._mod.Event(enable_timing=enable_timing) if self._mod is not None else None

    @contextlib.contextmanager
    def stream(self, stream: Any | None) -> Iterator[None]:
        with self._mod.stream(stream) if self._mod is not None and stream is not None else contextlib.nullcontext():
            yield

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory; host memory on CPU."""
        if self._mod is not None:
            return tuple(self._mod.mem_get_info())  # type: ignore[return-value]
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def empty_cache(self) -> tuple[int, int]:
        """Hand the caching allocator's free blocks back to the device; its reserved bytes (before, after).

        Through the device's own module (``torch.npu.empty_cache``): torch's
        accelerator API reaches an allocator only where the backend registered
        it there."""
        if self._mod is None:
            return 0, 0
        before = int(self._mod.memory_reserved())
        self._mod.empty_cache()
        return before, int(self._mod.memory_reserved())

    def new_graph(self) -> Any:
        """A graph object (NPUGraph / CUDAGraph); there is none on CPU."""
        if self.kind in ("npu", "cuda"):
            return torch.npu.NPUGraph() if self.kind == "npu" else torch.cuda.CUDAGraph()
        raise RuntimeError("graph capture needs an NPU or CUDA device; this kernel runs on cpu")

    def _graph_mod(self, what: str, npu_only: bool = False) -> Any:
        if self._mod is None or (npu_only and self.kind != "npu"):
            needs = "an NPU" if npu_only else "an NPU or CUDA device"
            raise RuntimeError(f"{what} needs {needs}; this kernel runs on {self.kind}")
        return self._mod

    def current_stream(self) -> Any | None:
        return self._mod.current_stream() if self._mod is not None else None

    def graph_pool_handle(self) -> Any:
        """A memory-pool token graphs can share (``torch.npu.graph_pool_handle()``)."""
        return self._graph_mod("a graph pool").graph_pool_handle()

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        """Context in which work issued on ``stream`` is captured into ``graph`` (``torch.npu.graph``)."""
        return self._graph_mod("graph capture").graph(graph, pool=pool, stream=stream)

    def weak_ref(self, tensor: Any) -> Any:
        """A tensor on the same memory that does not keep it alive (the graph pool does); else the tensor."""
        make = getattr(getattr(_torch_npu(), "_C", None), "_weak_ref_tensor", None) if self.kind == "npu" else None
        return make(tensor) if make is not None and isinstance(tensor, torch.Tensor) else tensor

    @contextlib.contextmanager
    def graph_task_group(self, stream: Any) -> Iterator[GraphTaskGroup]:
        """Mark the tasks issued inside as one updatable group of the graph being captured on ``stream``."""
        npu = self._graph_mod("graph task groups", npu_only=True)
        group = GraphTaskGroup(event=npu.ExternalEvent())
        group.event.wait(stream)  # the replayed graph waits for the latest update of this group
        group.event.reset(stream)
        npu.graph_task_group_begin(stream)
        yield group
        group.handle = npu.graph_task_group_end(stream)

    @contextlib.contextmanager
    def graph_task_update(self, group: GraphTaskGroup, stream: Any) -> Iterator[None]:
        """Ops re-issued inside replace the captured params of ``group``'s tasks (issued on ``stream``)."""
        npu = self._graph_mod("graph task updates", npu_only=True)
        with npu.stream(stream):
            npu.graph_task_update_begin(stream, group.handle)
            yield
            npu.graph_task_update_end(stream)
            group.event.record(stream)

    def zeros_bytes(self, nbytes: int, device: torch.device, alignment: int = 1) -> tuple[torch.Tensor, int]:
        """A zeroed int8 buffer of ``nbytes`` whose first byte is ``alignment``-aligned.

        Returns the buffer view and the slack (bytes allocated beyond ``nbytes``
        to reach the alignment; at most ``alignment - 1`` are ever used).
        """
        if alignment <= 1:
            return torch.zeros(nbytes, dtype=torch.int8, device=device), 0
        raw = torch.zeros(nbytes + alignment, dtype=torch.int8, device=device)
        offset = (-raw.data_ptr()) % alignment
        return raw[offset : offset + nbytes], alignment

    def format_cast(self, tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
        """Cast to an ACL storage format (2 = ND, 29 = FRACTAL_NZ) on NPU; identity elsewhere."""
        if self.kind == "npu":
            return _torch_npu().npu_format_cast(tensor, acl_format)
        return tensor

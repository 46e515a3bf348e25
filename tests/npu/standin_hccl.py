"""A stand-in HCCL device group: in-process ranks (threads) of one world, over stand-in NPU tensors.

Why: on an NPU, the EP group's ``device_group`` is HCCL and moves device
tensors; the stand-in device refuses any c10d collective on its tensors (a
gloo group handed device tensors fails as it would on an NPU). The device
paths (EPLB's weight moves over vLLM's ``torch_nccl`` communicator) need a
group that takes device tensors, with real semantics, so this is one: a
``torch.distributed.ProcessGroup`` subclass whose point-to-point and
collective methods move the values between the ranks of a :class:`Fabric`.

Semantics kept (those of HCCL/NCCL that the callers rely on):

* every tensor must be on the stand-in NPU (HCCL takes device tensors only;
  a host tensor is refused, naming it);
* ``send`` is asynchronous and ordered per (source, destination, tag):
  receives match sends in the order they were posted;
* ``recv`` completes in ``Work.wait()``, which blocks until the matching send
  arrived (a peer that never sends fails after :data:`TIMEOUT_S`, no hang)
  and refuses a payload whose shape or dtype differs from the buffer's;
* ``allreduce`` (SUM) and ``barrier`` need every rank of the world.

What crossed the fabric is counted (:attr:`Fabric.sent`), so a test can see
that a move went over this group and not another one.

Kernels that do their own communication (MC2's dispatch/combine) address a
group by its HCCL communicator name, as torch_npu's do
(``group._get_backend(npu).get_hccl_comm_name(rank)``): each fabric has one,
and :func:`fabric_named` finds it, so the fake torch_npu's MC2 kernels
exchange tokens between the ranks of the group they were given
(:meth:`Fabric.exchange`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import defaultdict, deque
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from npu.standin import NpuTensor

#: how long a receive or a collective waits for its peers before failing
TIMEOUT_S = 30.0


#: every live fabric by its HCCL communicator name (the name MC2 kernels are given)
_BY_NAME: "weakref.WeakValueDictionary[str, Fabric]" = weakref.WeakValueDictionary()
_NAMES = itertools.count()


def fabric_named(name: str) -> "Fabric | None":
    """The fabric whose groups answer ``name`` as their HCCL communicator name (None: no such stand-in group)."""
    return _BY_NAME.get(name)


class Fabric:
    """The links of one in-process world: a mailbox per (source, destination, tag), a barrier, reduce slots."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.name = f"standin_hccl_{next(_NAMES)}"
        _BY_NAME[self.name] = self
        self.posted: list[Any] = [None] * world
        self.ready = threading.Condition()
        self.mail: dict[tuple[int, int, int], deque] = defaultdict(deque)
        self.sent: list[tuple[int, int, tuple[int, ...]]] = []  # (source, destination, shape) per message
        self.gate = threading.Barrier(world, timeout=TIMEOUT_S)
        self.slots: list[torch.Tensor | None] = [None] * world

    def exchange(self, rank: int, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank (all ranks must call: what a kernel's own all-to-all sees)."""
        self.posted[rank] = value
        self.gate.wait()
        values = list(self.posted)
        self.gate.wait()  # every rank has read every value before any is cleared or overwritten
        self.posted[rank] = None
        missing = [r for r, v in enumerate(values) if v is None]
        if missing:
            raise RuntimeError(f"HCCL exchange on {self.name}: nothing from rank(s) {missing} (two callers gave "
                               "the same rank?)")
        return values

    @contextlib.contextmanager
    def groups(self) -> Iterator[list["StandinHcclGroup"]]:
        """One group object per rank (each rank's thread uses its own), known to torch.distributed meanwhile.

        ``dist.P2POp`` and ``dist.get_global_rank`` look a group up in torch's
        table of groups (``distributed_c10d._world.pg_group_ranks``, filled by
        ``new_group``, which needs a default world these threads do not have):
        each group is entered there (group rank = global rank) for the block
        and taken out after, also on an error.
        """
        from torch.distributed import distributed_c10d

        groups = [StandinHcclGroup(self, rank) for rank in range(self.world)]
        table = distributed_c10d._world.pg_group_ranks
        for group in groups:
            table[group] = {rank: rank for rank in range(self.world)}
        try:
            yield groups
        finally:
            for group in groups:
                table.pop(group, None)


class _Work(dist.Work):
    """A request: done when ``finish`` (if any) has run, on the first ``wait``."""

    def __init__(self, finish: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._finish = finish

    def wait(self, timeout: Any = None) -> bool:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return True

    def is_completed(self) -> bool:
        return self._finish is None


def _device_only(op: str, tensors: list[torch.Tensor]) -> list[NpuTensor]:
    for tensor in tensors:
        if not isinstance(tensor, NpuTensor):
            raise RuntimeError(f"HCCL {op}: a tensor on {tensor.device} (shape {tuple(tensor.shape)}); the device "
                               "group takes npu tensors only")
    return tensors  # type: ignore[return-value]


class StandinHcclGroup(dist.ProcessGroup):
    """One rank's view of a :class:`Fabric`: what ``GroupCoordinator.device_group`` is on an NPU."""

    def __init__(self, fabric: Fabric, rank: int) -> None:
        super().__init__(rank, fabric.world)
        self.fabric = fabric
        self.my_rank = rank

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "hccl"

    def _get_backend(self, device: torch.device) -> Any:
        """The group's backend for a device: HCCL for npu (its communicator name), none for another device."""
        if torch.device(device).type != "npu":
            raise RuntimeError(f"the stand-in HCCL group has no backend for {device} (HCCL serves npu only)")
        name = self.fabric.name
        return type("HcclBackend", (), {"get_hccl_comm_name": staticmethod(lambda rank: name)})()

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.fabric.world or peer == self.my_rank:
            raise ValueError(f"HCCL peer {peer} from rank {self.my_rank} in a world of {self.fabric.world}")
        return peer

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        fabric = self.fabric
        for tensor in _device_only("send", tensors):
            with fabric.ready:
                fabric.mail[(self.my_rank, self._peer(dst), tag)].append(tensor.host.clone())
                fabric.sent.append((self.my_rank, dst, tuple(tensor.shape)))
                fabric.ready.notify_all()
        return _Work()

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Work:
        fabric, key = self.fabric, (self._peer(src), self.my_rank, tag)
        targets = _device_only("recv", tensors)

        def finish() -> None:
            for tensor in targets:
                with fabric.ready:
                    if not fabric.ready.wait_for(lambda: fabric.mail[key], timeout=TIMEOUT_S):
                        raise RuntimeError(f"HCCL recv on rank {self.my_rank}: nothing from rank {src} "
                                           f"(tag {tag}) in {TIMEOUT_S:.0f} s")
                    payload = fabric.mail[key].popleft()
                if payload.shape != tensor.shape or payload.dtype != tensor.dtype:
                    raise RuntimeError(f"HCCL recv on rank {self.my_rank}: rank {src} sent {tuple(payload.shape)} "
                                       f"{payload.dtype} into a buffer of {tuple(tensor.shape)} {tensor.dtype}")
                tensor.host.copy_(payload)

        return _Work(finish)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _Work:
        if opts is not None and getattr(opts, "reduceOp", dist.ReduceOp.SUM) != dist.ReduceOp.SUM:
            raise NotImplementedError("the stand-in HCCL group reduces with SUM only")
        fabric = self.fabric
        for tensor in _device_only("allreduce", tensors):
            fabric.slots[self.my_rank] = tensor.host.clone()
            fabric.gate.wait()
            total = torch.stack([slot for slot in fabric.slots]).sum(0)  # type: ignore[misc]
            fabric.gate.wait()  # every rank has read every slot before any is overwritten
            tensor.host.copy_(total)
        return _Work()

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        """SUM over the ranks of ``input``, this rank's ``output``-sized chunk of it (dim 0, rank order)."""
        if opts is not None and getattr(opts, "reduceOp", dist.ReduceOp.SUM) != dist.ReduceOp.SUM:
            raise NotImplementedError("the stand-in HCCL group reduces with SUM only")
        _device_only("reduce_scatter", [output, input])
        if input.shape[0] != output.shape[0] * self.fabric.world:
            raise RuntimeError(f"HCCL reduce_scatter: input {tuple(input.shape)} is not {self.fabric.world} "
                               f"outputs of {tuple(output.shape)}")
        total = torch.stack(self.fabric.exchange(self.my_rank, input.host.clone())).sum(0)
        rows = output.shape[0]
        output.host.copy_(total[self.my_rank * rows:(self.my_rank + 1) * rows])
        return _Work()

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        """Every rank's ``input`` into ``output`` along dim 0, in rank order."""
        _device_only("all_gather", [output, input])
        if output.shape[0] != input.shape[0] * self.fabric.world:
            raise RuntimeError(f"HCCL all_gather: output {tuple(output.shape)} is not {self.fabric.world} inputs "
                               f"of {tuple(input.shape)}")
        output.host.copy_(torch.cat(self.fabric.exchange(self.my_rank, input.host.clone())))
        return _Work()

    _reduce_scatter_base = reduce_scatter_single  # the names an older torch's c10d calls
    _allgather_base = all_gather_single

    def barrier(self, opts: Any = None) -> _Work:
        self.fabric.gate.wait()
        return _Work()


#: the rank a :func:`run_ranks` thread runs (a fused kernel's own collective knows its rank from its communicator)
_THIS_RANK = threading.local()


def current_rank() -> int:
    """The rank of the calling :func:`run_ranks` thread."""
    rank = getattr(_THIS_RANK, "rank", None)
    if rank is None:
        raise RuntimeError("not on a stand-in HCCL rank's thread (standin_hccl.run_ranks)")
    return rank


def run_ranks(world: int, body: Callable[[int], Any]) -> list[Any]:
    """``body(rank)`` on ``world`` threads at once; their results by rank, or the first rank's error raised."""
    results: list[Any] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def run(rank: int) -> None:
        _THIS_RANK.rank = rank
        try:
            results[rank] = body(rank)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), name=f"npu-rank{rank}") for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2 * TIMEOUT_S)
    for rank, error in enumerate(errors):
        if error is not None:
            raise error
    return results

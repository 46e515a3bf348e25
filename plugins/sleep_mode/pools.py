"""The device-allocator seam of sleep mode: tagged pools of tensor storages.

Sleep mode frees the memory behind groups of tensors ("weights",
"kv_cache") and later gives it back, without the code that holds those
tensors noticing: every parameter, view and KV cache binding keeps pointing
at the same tensor objects. A pool works one level below the tensors, on
their storages: a tagged storage is shrunk to zero bytes (its memory goes
back to the allocator) and regrown to its old size on restore. Views survive
because they share the storage object, not its memory.

Per tag, three operations, as a CaMem-style allocator offers them:

* ``offload(tag)``: contents copied to host memory, the storage freed;
  ``restore`` copies them back.
* ``discard(tag)``: the storage freed, contents dropped; ``restore``
  regrows it zero-filled (as the KV cache is first allocated). Storages
  registered with ``preserve=True`` keep a host copy even when discarded
  (buffers that no checkpoint reload brings back).
* ``restore(tag)``: resident again; a no-op on a resident tag.

:class:`TaggedPools` is the reference provider: exact semantics on any
torch device, what a CPU host runs. A device provider subclasses it and
overrides only the hooks that differ (``_host_buffer``, ``_release``);
:mod:`ascend_kernel_plugins.sleep_mode.npu_pools` is the NPU one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from typing import Iterable

import torch

#: the states a tag can be in
RESIDENT, OFFLOADED, DISCARDED = "resident", "offloaded", "discarded"


@dataclass
class _Entry:
    """One storage of a pool: the storage object, its size, and the host copy while it is away."""

    storage: torch.UntypedStorage
    nbytes: int
    name: str
    preserve: bool = False
    host: torch.Tensor | None = None


@dataclass
class _Pool:
    entries: list[_Entry] = field(default_factory=list)
    state: str = RESIDENT


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A fresh uint8 view of the whole storage (never kept: its size is fixed at creation)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class TaggedPools:
    """Tensor storages grouped under tags, offloaded / discarded / restored a tag at a time."""

    #: the tags vLLM's sleep and wake-up name
    TAGS: tuple[str, ...] = ("weights", "kv_cache")

    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        #: the device allocator's reserved bytes (before, after) the last release, where a provider measures them
        self.reserved: tuple[int, int] | None = None

    # -- registration ------------------------------------------------------------

    def register(self, tag: str, tensors: Iterable[tuple[str, torch.Tensor]], preserve: bool = False) -> int:
        """Put the storages of ``tensors`` (name, tensor) under ``tag``; returns the bytes added.

        A storage shared by several tensors (tied weights, views, the KV
        cache's one backing buffer) is registered once. Every storage is
        checked first, so a bad one leaves the pools unchanged.
        """
        self._check_tag(tag)
        away = [t for t, p in self._pools.items() if p.state != RESIDENT]
        if away:
            raise ValueError(f"cannot register tensors while tags {away} are not resident")
        # a storage is known by where its memory lives now (every registered storage is resident here)
        owner = {e.storage.data_ptr(): t for t, p in self._pools.items() for e in p.entries}
        new: dict[int, _Entry] = {}
        for name, tensor in tensors:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() == 0 or key in new:
                continue
            if key in owner:
                if owner[key] != tag:
                    raise ValueError(f"tensor '{name}' is already in the pool of tag '{owner[key]}'; "
                                     f"a storage belongs to one tag only (asked: '{tag}')")
                continue
            if not storage.resizable():
                raise ValueError(f"tensor '{name}' has a storage that cannot be resized (memory-mapped or "
                                 "borrowed from another library); sleep mode can only free storages torch owns")
            new[key] = _Entry(storage, storage.nbytes(), name, preserve)
        self._pools.setdefault(tag, _Pool()).entries.extend(new.values())
        return sum(e.nbytes for e in new.values())

    def clear(self) -> None:
        """Forget every registration (only while everything is resident: nothing is away to lose)."""
        away = [t for t, p in self._pools.items() if p.state != RESIDENT]
        if away:
            raise ValueError(f"cannot clear the pools while tags {away} are not resident")
        self._pools.clear()

    # -- the three operations ----------------------------------------------------

    def offload(self, tag: str) -> int:
        """Copy the tag's contents to host memory and free its storages; returns the bytes freed."""
        return self._free(tag, OFFLOADED, keep_all=True)

    def discard(self, tag: str) -> int:
        """Free the tag's storages, dropping their contents (except preserved ones); returns the bytes freed."""
        return self._free(tag, DISCARDED, keep_all=False)

    def restore(self, tag: str) -> int:
        """Regrow the tag's storages: contents copied back where kept, zeros where discarded."""
        pool = self._pool(tag)
        if pool.state == RESIDENT:
            return 0
        for entry in pool.entries:
            entry.storage.resize_(entry.nbytes)
            view = _bytes_of(entry.storage)
            if entry.host is not None:
                view.copy_(entry.host)
                entry.host = None
            else:
                view.zero_()
        pool.state = RESIDENT
        self._synchronize()
        return self.bytes(tag)

    # -- inspection ----------------------------------------------------------------

    def state(self, tag: str) -> str:
        return self._pool(tag).state

    def bytes(self, tag: str) -> int:
        """Bytes the tag holds when resident."""
        return sum(e.nbytes for e in self._pool(tag).entries)

    def tags(self) -> list[str]:
        return list(self._pools)

    def describe(self) -> dict[str, dict[str, int | str]]:
        return {tag: {"state": pool.state, "bytes": self.bytes(tag), "storages": len(pool.entries)}
                for tag, pool in self._pools.items()}

    # -- provider hooks ------------------------------------------------------------

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        """Host memory for an offloaded copy (a device provider pins it)."""
        return torch.empty(nbytes, dtype=torch.uint8)

    def _synchronize(self) -> None:
        """Wait for queued device copies (nothing to wait for on a host)."""

    def _release(self) -> None:
        """Hand freed memory back to the system: glibc keeps small freed blocks in its heap until trimmed."""
        libc = ctypes.util.find_library("c")
        if libc is not None:
            trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
            if trim is not None:
                trim(0)

    # -- internals -----------------------------------------------------------------

    def _free(self, tag: str, new_state: str, keep_all: bool) -> int:
        pool = self._pool(tag)
        if pool.state != RESIDENT:
            raise ValueError(f"tag '{tag}' is already {pool.state}; restore it first")
        stuck = [e.name for e in pool.entries if not e.storage.resizable()]
        if stuck:  # a storage can become fixed after registration (e.g. shared with numpy): free none of them
            raise ValueError(f"cannot free tag '{tag}': the storages of {stuck} can no longer be resized")
        for entry in pool.entries:
            if keep_all or entry.preserve:
                entry.host = self._host_buffer(entry.nbytes)
                entry.host.copy_(_bytes_of(entry.storage))
        self._synchronize()
        for entry in pool.entries:
            entry.storage.resize_(0)
        pool.state = new_state
        self._release()
        return self.bytes(tag)

    def _pool(self, tag: str) -> _Pool:
        self._check_tag(tag)
        if tag not in self._pools:
            registered = ", ".join(self._pools) or "none"
            raise ValueError(f"no tensors are registered under tag '{tag}' (registered: {registered})")
        return self._pools[tag]

    def _check_tag(self, tag: str) -> None:
        if tag not in self.TAGS:
            raise ValueError(f"unknown sleep-mode tag '{tag}'; allowed: {', '.join(self.TAGS)}")

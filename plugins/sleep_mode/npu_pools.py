"""The NPU provider of the tagged pools: the reference semantics plus what device memory needs.

vllm-ascend frees sleep-mode memory with a pluggable allocator
(``torch.npu.memory.NPUPluggableAllocator`` over a compiled extension that
maps and unmaps CANN physical memory per tag), which keeps virtual addresses
across a sleep so captured graphs stay valid. This project ships no compiled
extension, so this provider frees at the storage level instead, through
documented torch APIs only: ``UntypedStorage.resize_`` (how FSDP frees
sharded parameters on an accelerator), pinned host buffers for offloaded
copies, the device seam's ``synchronize`` and ``empty_cache`` (torch_npu's
``torch.npu.empty_cache``: ``torch.accelerator.empty_cache`` reaches the NPU's
caching allocator only if torch_npu registered it with torch's accelerator
API, so the device's own call is used) to hand freed blocks back to the
device. Whether they went back is measured: the allocator's reserved bytes
before and after, which the controller logs beside the bytes it freed.

Consequence, checked by the controller: storage addresses change across a
sleep, so a graph mode that captured device addresses cannot be kept; sleep
mode refuses such a mode rather than replay stale addresses.
Not run in this project's CI (no NPU).
"""

from __future__ import annotations

import torch

from ascend_kernel.device import Device
from ascend_kernel_plugins.sleep_mode.pools import TaggedPools


class NpuTaggedPools(TaggedPools):
    """Tagged pools whose storages live in NPU memory."""

    def __init__(self) -> None:
        super().__init__()
        self._device = Device("npu")

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _synchronize(self) -> None:
        self._device.synchronize()

    def _release(self) -> None:
        before, after = self._device.empty_cache()
        self.reserved = (self.reserved[0] if self.reserved else before, after)  # since the controller reset it

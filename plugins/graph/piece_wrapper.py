"""What every static-graph wrapper shares: vLLM's wrapper contract around one piece of the model.

vLLM wraps each compiled piece (or the whole model) in the platform's static
graph wrapper class and drives it through the forward context: the runtime
mode says whether this forward pass replays graphs of the wrapper's kind,
and the batch descriptor names the captured shape. A wrapper forwards
attribute reads to the piece it wraps (vLLM reads them), runs the piece
plainly when the forward pass is not its mode, captures a descriptor on
first sight (vLLM's capture loop) and replays it afterwards. Subclasses say
how to capture and replay (:meth:`_capture`, :meth:`_replay`).
"""

from __future__ import annotations

from typing import Any, Callable


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
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context, is_forward_context_available

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

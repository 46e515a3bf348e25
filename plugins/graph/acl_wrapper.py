"""ACL graphs for the ``aclgraph`` mode: vLLM's static-graph wrapper contract, captured through the device seam.

vLLM wraps each piece of a piecewise-compiled model (or, in FULL and
FULL_DECODE_ONLY, the whole model) in the platform's static graph wrapper and
drives it through the forward context: ``cudagraph_runtime_mode`` says whether
this pass is captured/replayed at all, ``batch_descriptor`` which captured
graph it is. :class:`AclGraphWrapper` keeps that contract (the constructor and
call of vLLM's ``CUDAGraphWrapper``) but never names ``torch.npu``: the graph
object, the capture context, the pool token and weak references come from the
device seam (:class:`ascend_kernel.device.Device`), so a recording stand-in can
take the NPU's place in tests (``tests/graph_standin.py``).

What a graph demands is checked, not assumed: every tensor input's address is
recorded at capture and compared before each replay (a moved input raises
:class:`MovedInputError` naming it; vLLM checks this only in debug mode), since
a replay reads whatever lies at the captured address.

FULL graphs (FULL / FULL_DECODE_ONLY) hold attention, whose Ascend kernels read
the sequence lengths on the host when their task is built. So a FULL wrapper
publishes its capture (:func:`~ascend_kernel_plugins.graph.capture_session.full_capture`:
device, graph, stream) while the runnable runs, for the attention impl to
issue updatable task groups into, and before every FULL replay lets the
device's replay preparers re-issue those tasks with the pass's lengths
(:func:`~ascend_kernel_plugins.graph.capture_session.prepare_replay`). A
PIECEWISE wrapper does neither: attention runs eagerly between its pieces.

Not run on an NPU: the real calls follow torch_npu's documented signatures
(``NPUGraph()``, ``torch.npu.graph(graph, pool=, stream=)``, ``replay()``).
"""

from __future__ import annotations

import weakref
from contextlib import ExitStack
from typing import Any, Callable


from ascend_kernel.upstream import tree_map

from ascend_kernel_plugins.graph.capture_session import forget_graph, full_capture, prepare_replay
from ascend_kernel_plugins.graph.piece_wrapper import (CapturedAddresses, MovedInputError, PieceWrapper,
                                                      gc_collect_skipped, piece_input_names)

__all__ = ["AclGraphWrapper", "MovedInputError"]

#: one pool token per injected device, shared by all its wrappers (as vLLM shares the platform's)
_POOLS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class AclEntry:
    """One captured batch descriptor: its graph, the input addresses it read, its outputs (weak refs)."""

    __slots__ = ("descriptor", "graph", "addresses", "output", "replays")

    def __init__(self, descriptor: Any, graph: Any, addresses: CapturedAddresses, output: Any) -> None:
        self.descriptor = descriptor
        self.graph = graph
        self.addresses = addresses
        self.output = output
        self.replays = 0


class AclGraphWrapper(PieceWrapper):
    """vLLM's static graph wrapper (``CUDAGraphWrapper``'s constructor and call) on the device-graph seam.

    ``device`` is for tests: a stand-in with the seam's graph methods. Without
    it the kernel's device is used and the pool is the platform's global one
    (``current_platform.get_global_graph_pool()``, as vLLM's wrapper does).
    """

    def __init__(self, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: Any,
                 cudagraph_options: Any = None, device: Any = None) -> None:
        from vllm.config import CUDAGraphMode

        if runtime_mode == CUDAGraphMode.NONE:
            raise ValueError("a static graph wrapper needs a runtime mode that captures (PIECEWISE or FULL)")
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.gc_disable = bool(getattr(cudagraph_options, "gc_disable", False))
        self.weak_ref_output = bool(getattr(cudagraph_options, "weak_ref_output", True))
        if device is None:
            from vllm.platforms import current_platform

            from ascend_kernel import kernel as kernel_mod

            self.device = kernel_mod.current().device
            self.graph_pool = current_platform.get_global_graph_pool()
        else:
            self.device = device
            if device not in _POOLS:
                _POOLS[device] = device.graph_pool_handle()
            self.graph_pool = _POOLS[device]
        self.entries: dict[Any, AclEntry] = {}
        self.input_names = piece_input_names(runnable)
        self.full = runtime_mode == CUDAGraphMode.FULL

    def clear_graphs(self) -> None:
        for entry in self.entries.values():
            forget_graph(self.device, entry.graph)
        super().clear_graphs()

    def _replay(self, entry: AclEntry, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entry.addresses.check(args, kwargs, self.input_names, descriptor)
        if self.full:  # host-held task params (attention's lengths) re-issued for this pass, then the replay
            from vllm.forward_context import get_forward_context

            prepare_replay(self.device, entry.graph, get_forward_context())
        entry.graph.replay()
        entry.replays += 1
        return entry.output

    def _capture(self, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Capture the runnable for this descriptor into a new graph (only while vLLM's capture loop runs)."""
        from vllm.compilation.monitor import validate_cudagraph_capturing_enabled

        validate_cudagraph_capturing_enabled()
        device = self.device
        addresses = CapturedAddresses(args, kwargs)
        graph = device.new_graph()
        weak = lambda out: tree_map(device.weak_ref, out)  # noqa: E731
        with ExitStack() as stack:
            if self.gc_disable:  # later pieces of one pass skip the collection the capture context runs
                stack.enter_context(gc_collect_skipped())
            stream = device.current_stream()
            stack.enter_context(device.graph_capture(graph, pool=self.graph_pool, stream=stream))
            if self.full:
                stack.enter_context(full_capture(device, graph, stream))
            output = self.runnable(*args, **kwargs)
            if self.weak_ref_output:  # only the last piece's output may be dropped here (no piece reads it)
                output = weak(output)
        self.entries[descriptor] = AclEntry(descriptor, graph, addresses, weak(output))
        return output  # the capture's own tensors, so the allocator sees them in use until the pass ends


"""How much of a full graph the Ascend backends' attention may sit in, per device.

vLLM asks each attention builder ``get_cudagraph_support()`` before it
dispatches full graphs, and downgrades the graph mode when the answer is too
low. The honest answer differs by device:

* on an NPU, what a captured graph replays must be kept current by the backend
  itself: the standard and MLA backends re-issue their single-token decode
  tasks with each batch's lengths (see :mod:`.graph_params`), so they declare
  single-token decode; the SFA backend does not update its tasks (its kernels
  also read lengths on the host), so it declares none;
* on a CPU (the ``cpu-graph`` mode) attention is an opaque op inside the
  captured artifact and runs its kernels at every replay with that step's
  metadata, so any uniform batch is safe, speculative decoding's several query
  tokens per request included.
"""

from __future__ import annotations

from vllm.v1.attention.backend import AttentionCGSupport

from ascend_kernel import kernel as kernel_mod


def full_graph_support(on_npu: AttentionCGSupport) -> AttentionCGSupport:
    """``on_npu`` on an NPU; uniform batches where attention runs eagerly inside the captured artifact (CPU)."""
    if kernel_mod.current().device.kind == "cpu":
        return AttentionCGSupport.UNIFORM_BATCH
    return on_npu

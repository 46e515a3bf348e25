"""FULL_DECODE_ONLY: keep a captured decode graph's attention tasks current with each batch's sequence lengths.

Why: Ascend's paged-attention kernel reads the sequence lengths on the host
while its task is built, so a task captured into an ACL graph holds the
lengths of the capture batch (see :mod:`ascend_kernel.ops.graph_ops`). Every
other input is read by address at replay; these are not. Before each replay
the attention tasks must be re-issued with the current lengths, as task
updates of the captured graph.

Where it lives and how the pieces find it:

* one :class:`DecodeGraphParams` per device (:func:`decode_graph_params`), so
  per graph pool: every ACL wrapper of a device captures into that device's
  pool. It registers itself as the device's replay preparer
  (:mod:`ascend_kernel_plugins.graph.capture_session`);
* capture: while an ``AclGraphWrapper`` with runtime mode FULL records a
  graph it publishes the capture (device, graph, stream). The Ascend impl's
  decode branch sees it (:func:`captured_decode`), checks the pass against
  vLLM's forward context (runtime mode FULL, the batch descriptor's size) and
  issues its layer's paged attention through :meth:`DecodeGraphParams.paged_attention`:
  one task group per layer, recorded under the graph with the layer's name;
* replay: before the wrapper replays a FULL graph it calls
  :meth:`DecodeGraphParams.before_replay` with the graph and the pass's
  forward context; each recorded task is re-issued inside
  ``device.graph_task_update`` with the host lengths of its layer's metadata
  for this step (``forward_context.attn_metadata[layer_name].seq_lens``, which
  the Ascend builder keeps in one host buffer, padded requests at length 1:
  :mod:`.host_lengths`).

All device work goes through the device seam and the ops seam, so a recording
stand-in (``tests/graph_standin.py``) checks the protocol on a CPU.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Hashable

import torch


@dataclass
class AttentionTask:
    """One layer's captured paged-attention call: its task group and what it was issued with."""

    layer_name: str | None
    group: Any
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    num_heads: int
    num_kv_heads: int
    out: torch.Tensor
    workspace: torch.Tensor | None


class DecodeGraphParams:
    """Per captured graph, the attention tasks of the decode graph, re-issued with new lengths before a replay.

    ``key`` in the methods below names a captured graph: the graph object when
    driven by the ACL wrapper, any hashable in direct use.
    """

    def __init__(self, device: Any, ops: Any, update_stream: Any = None) -> None:
        self.device = device
        self.ops = ops
        #: updates go on a stream of their own; the replayed graph waits on each group's event
        self.update_stream = update_stream if update_stream is not None else device.new_stream()
        self.tasks: dict[Hashable, list[AttentionTask]] = {}
        #: one workspace per graph and call shape, shared by its layers (their tasks run one after another)
        self.workspaces: dict[tuple[Any, ...], torch.Tensor | None] = {}

    def paged_attention(self, key: Hashable, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        num_heads: int, num_kv_heads: int, out: torch.Tensor,
                        layer_name: str | None = None) -> torch.Tensor:
        """Issue one layer's decode attention, inside the capture of graph ``key``, as an updatable task.

        The workspace is sized now for the longest lengths a replay can see:
        every request at the most tokens its block-table row can address
        (vLLM captures with length-1 dummy requests, far shorter than a real step).
        """
        args = (query, key_cache, value_cache, block_table, seq_lens, scale, num_heads, num_kv_heads)
        workspace = self._workspace(key, *args, out)
        with self.device.graph_task_group(self.device.current_stream()) as group:
            self.ops.paged_attention_out(*args, out, workspace)
        self.tasks.setdefault(key, []).append(
            AttentionTask(layer_name, group, query, key_cache, value_cache, block_table, seq_lens, scale, num_heads,
                          num_kv_heads, out, workspace))
        return out

    def _workspace(self, key: Hashable, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, num_heads: int,
                   num_kv_heads: int, out: torch.Tensor) -> torch.Tensor | None:
        shape = (key, tuple(query.shape), query.dtype, tuple(key_cache.shape), tuple(block_table.shape), num_heads,
                 num_kv_heads)
        if shape not in self.workspaces:
            longest = torch.full_like(seq_lens, block_table.shape[1] * key_cache.shape[1])
            self.workspaces[shape] = self.ops.paged_attention_workspace(
                query, key_cache, value_cache, block_table, longest, scale, num_heads, num_kv_heads, out)
        return self.workspaces[shape]

    def update(self, key: Hashable, seq_lens: torch.Tensor) -> int:
        """Re-issue every attention task captured in graph ``key`` with ``seq_lens``; returns how many.

        ``seq_lens`` is the step's host int32 lengths, one per (padded) request
        of the captured size; a tensor of another shape is a caller error.
        """
        tasks = self.tasks.get(key, [])
        for task in tasks:
            self._reissue(key, task, seq_lens)
        return len(tasks)

    def before_replay(self, graph: Any, forward_context: Any) -> int:
        """Re-issue ``graph``'s tasks, each with its layer's lengths from this pass's attention metadata."""
        tasks = self.tasks.get(graph, [])
        if not tasks:
            return 0
        metadata = forward_context.attn_metadata
        if not isinstance(metadata, dict):
            raise NotImplementedError("micro-batched attention metadata (a list per micro-batch) is not "
                                      "supported by ACL FULL graphs with task updates")
        for task in tasks:
            layer = metadata.get(task.layer_name)
            if layer is None:
                raise KeyError(f"no attention metadata for layer {task.layer_name!r} in this pass: its captured "
                               f"attention task cannot be updated (layers with metadata: {sorted(metadata)})")
            self._reissue(graph, task, layer.seq_lens)
        return len(tasks)

    def _reissue(self, key: Hashable, task: AttentionTask, seq_lens: torch.Tensor) -> None:
        if seq_lens.shape != task.seq_lens.shape:
            raise ValueError(f"graph {key!r} was captured with {tuple(task.seq_lens.shape)} sequence lengths; "
                             f"got {tuple(seq_lens.shape)} (pad the batch to the size)")
        with self.device.graph_task_update(task.group, self.update_stream):
            self.ops.paged_attention_out(task.query, task.key_cache, task.value_cache, task.block_table, seq_lens,
                                         task.scale, task.num_heads, task.num_kv_heads, task.out, task.workspace)
        task.seq_lens = seq_lens

    def forget(self, key: Hashable) -> None:
        """Drop the tasks and workspaces recorded for graph ``key`` (its wrapper cleared it)."""
        self.tasks.pop(key, None)
        for shape in [s for s in self.workspaces if s[0] == key]:
            del self.workspaces[shape]

    def clear(self) -> None:
        """Forget every recorded task."""
        self.tasks.clear()
        self.workspaces.clear()


#: device -> its decode graph params (one per device, i.e. per graph pool)
_BY_DEVICE: "weakref.WeakKeyDictionary[Any, DecodeGraphParams]" = weakref.WeakKeyDictionary()


def decode_graph_params(device: Any, ops: Any) -> DecodeGraphParams:
    """The device's :class:`DecodeGraphParams`, made on first use and registered as its replay preparer."""
    from ascend_kernel_plugins.graph.capture_session import register_replay_preparer

    params = _BY_DEVICE.get(device)
    if params is None:
        params = _BY_DEVICE[device] = DecodeGraphParams(device, ops)
        register_replay_preparer(device, params)
    elif params.ops is not ops:
        raise RuntimeError(f"decode graph params of {device!r} issue through the {getattr(params.ops, 'name', '?')} "
                           f"ops provider; a layer asked with {getattr(ops, 'name', '?')} (one provider per process)")
    return params


def captured_decode(capture: Any, ops: Any, layer_name: str | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    num_heads: int, num_kv_heads: int, out: torch.Tensor) -> torch.Tensor:
    """One layer's attention inside an ACL FULL capture: single-token decode as an updatable task group.

    vLLM's forward context says which pass this is: runtime mode FULL and the
    batch descriptor of the size being captured. Only uniform single-token
    decode is captured with attention inside on an NPU (the Ascend builders
    declare no more), so this is decode whatever state the dummy capture
    batch was decided as (vLLM captures with length-1 requests, which read as
    fresh prefills); anything else is refused rather than captured wrong.
    """
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    descriptor = context.batch_descriptor
    if context.cudagraph_runtime_mode != CUDAGraphMode.FULL or descriptor is None:
        raise RuntimeError(f"an ACL FULL capture is in progress but the forward context says "
                           f"{context.cudagraph_runtime_mode} with descriptor {descriptor}")
    tokens, requests = query.shape[0], seq_lens.shape[0]
    if tokens != descriptor.num_tokens or tokens != requests:
        raise NotImplementedError(
            f"ACL FULL capture of {descriptor}: the Ascend backend captures single-token decode only "
            f"({tokens} tokens for {requests} requests); its lengths would be frozen in any other kernel")
    return decode_graph_params(capture.device, ops).paged_attention(
        capture.graph, query, key_cache, value_cache, block_table, seq_lens, scale, num_heads, num_kv_heads, out,
        layer_name=layer_name)

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
  one task group per layer, recorded under the graph with the layer's name.
  The Ascend MLA impl does the same with its latent-cache decode
  (:func:`captured_mla_decode`, :meth:`DecodeGraphParams.paged_attention_mla`);
* replay: before the wrapper replays a FULL graph it calls
  :meth:`DecodeGraphParams.before_replay` with the graph and the pass's
  forward context; each recorded task is re-issued inside
  ``device.graph_task_update`` with the host lengths of its layer's metadata
  for this step (``forward_context.attn_metadata[layer_name].seq_lens``, which
  the Ascend builder keeps in one host buffer, padded requests at length 1:
  :mod:`.host_lengths`; for MLA ``.decode.host_seq_lens``, kept the same way).

All device work goes through the device seam and the ops seam, so a recording
stand-in (``tests/graph_standin.py``) checks the protocol on a CPU.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Hashable

import torch


#: where a layer's metadata keeps the step's host lengths, per attention kind
STANDARD_LENGTHS = "seq_lens"
MLA_LENGTHS = "decode.host_seq_lens"


@dataclass
class AttentionTask:
    """One layer's captured decode-attention call: its task group, which seam op, and what it was issued with.

    ``args`` are the op's positional arguments with the lengths at
    ``lengths_at``; a re-issue swaps in the step's lengths there and keeps
    every other argument (the captured buffers) as it was. ``lengths_in`` is
    the dotted attribute of the layer's attention metadata that holds the
    step's host lengths (:data:`STANDARD_LENGTHS`, :data:`MLA_LENGTHS`).
    """

    layer_name: str | None
    group: Any
    op: str
    args: tuple[Any, ...]
    lengths_at: int
    lengths_in: str = STANDARD_LENGTHS

    @property
    def seq_lens(self) -> torch.Tensor:
        """The lengths the task was last issued with."""
        return self.args[self.lengths_at]

    def with_lengths(self, seq_lens: torch.Tensor) -> tuple[Any, ...]:
        """The task's arguments with ``seq_lens`` in place of its lengths."""
        return self.args[:self.lengths_at] + (seq_lens,) + self.args[self.lengths_at + 1:]


class DecodeGraphParams:
    """Per captured graph, the attention tasks of the decode graph, re-issued with new lengths before a replay.

    ``key`` in the methods below names a captured graph: the graph object when
    driven by the ACL wrapper, any hashable in direct use. A task is either
    kind of decode attention (standard paged attention or MLA's); each task
    records which seam op it issued, so one instance serves a model of either.
    """

    def __init__(self, device: Any, ops: Any, update_stream: Any = None) -> None:
        self.device = device
        self.ops = ops
        #: updates go on a stream of their own; the replayed graph waits on each group's event
        self.update_stream = update_stream if update_stream is not None else device.new_stream()
        self.tasks: dict[Hashable, list[AttentionTask]] = {}
        #: one workspace per graph and call shape, shared by its layers (their tasks run one after another);
        #: weak references (the graph's pool owns the memory)
        self.workspaces: dict[tuple[Any, ...], torch.Tensor | None] = {}
        #: the workspaces of the graph being captured, held strongly until its capture is over (inside one
        #: capture, memory freed back to the pool may be handed to the next allocation of the same capture)
        self._pinned: dict[Hashable, list[torch.Tensor]] = {}

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
        weak = self.device.weak_ref
        held = (weak(query), *args[1:], weak(out), workspace)
        self._record(key, AttentionTask(layer_name, None, "paged_attention_out", held, 4), live=(*args, out, workspace))
        return out

    def paged_attention_mla(self, key: Hashable, query: torch.Tensor, kv_cache: torch.Tensor,
                            block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, num_heads: int,
                            v_head_size: int, out: torch.Tensor, layer_name: str | None = None) -> torch.Tensor:
        """Issue one layer's MLA decode, inside the capture of graph ``key``, as an updatable task.

        No workspace: the MLA kernel has no workspace query to size one with
        (see :mod:`ascend_kernel.ops.graph_ops`). At replay its lengths come
        from the layer's ``decode.host_seq_lens``.
        """
        args = (query, kv_cache, block_table, seq_lens, scale, num_heads, v_head_size, out)
        weak = self.device.weak_ref
        held = (weak(query), *args[1:-1], weak(out))
        self._record(key, AttentionTask(layer_name, None, "paged_attention_mla_out", held, 3, MLA_LENGTHS), live=args)
        return out

    def _record(self, key: Hashable, task: AttentionTask, live: tuple[Any, ...]) -> None:
        """Issue ``task`` (with the ``live`` tensors: the capture's own) as a task group; keep ``task``.

        A task keeps what a re-issue needs, without owning the capture's
        memory: the query, the output and the workspace are held through the
        device's weak references (tensors on the same memory that the graph's
        pool keeps, not the task), so a graph of many layers and sizes pins no
        more than the pool does. The caches, the block table and the host
        lengths are the runner's persistent buffers, held as they are.
        """
        with self.device.graph_task_group(self.device.current_stream()) as group:
            getattr(self.ops, task.op)(*live)
        task.group = group
        self.tasks.setdefault(key, []).append(task)

    def _workspace(self, key: Hashable, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, num_heads: int,
                   num_kv_heads: int, out: torch.Tensor) -> torch.Tensor | None:
        shape = (key, tuple(query.shape), query.dtype, tuple(key_cache.shape), tuple(block_table.shape), num_heads,
                 num_kv_heads)
        self._captures_over(but=key)  # one capture at a time: a capture of ``key`` means the others are done
        if shape not in self.workspaces:
            longest = torch.full_like(seq_lens, block_table.shape[1] * key_cache.shape[1])
            workspace = self.ops.paged_attention_workspace(
                query, key_cache, value_cache, block_table, longest, scale, num_heads, num_kv_heads, out)
            # allocated inside the capture: the graph's pool owns its memory, this table only finds it again
            self.workspaces[shape] = self.device.weak_ref(workspace) if workspace is not None else None
            if workspace is not None:
                self._pinned.setdefault(key, []).append(workspace)
        return self.workspaces[shape]

    def update(self, key: Hashable, seq_lens: torch.Tensor) -> int:
        """Re-issue every attention task captured in graph ``key`` with ``seq_lens``; returns how many.

        ``seq_lens`` is the step's host int32 lengths, one per (padded) request
        of the captured size; a tensor of another shape is a caller error.
        """
        self._captures_over()
        tasks = self.tasks.get(key, [])
        for task in tasks:
            self._reissue(key, task, seq_lens)
        return len(tasks)

    def _captures_over(self, but: Hashable = None) -> None:
        """Release the strong hold on the workspaces of captures that are over (every graph but ``but``)."""
        for key in [k for k in self._pinned if k is not but]:
            del self._pinned[key]

    def before_replay(self, graph: Any, forward_context: Any) -> int:
        """Re-issue ``graph``'s tasks, each with its layer's lengths from this pass's attention metadata."""
        self._captures_over()  # a replay runs after every capture
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
            try:
                lengths = attrgetter(task.lengths_in)(layer)
            except AttributeError as e:
                raise KeyError(f"the metadata of layer {task.layer_name!r} has no {task.lengths_in} (a decode "
                               f"batch's host lengths): its captured {task.op} task cannot be updated") from e
            self._reissue(graph, task, lengths)
        return len(tasks)

    def _reissue(self, key: Hashable, task: AttentionTask, seq_lens: torch.Tensor) -> None:
        if seq_lens.shape != task.seq_lens.shape:
            raise ValueError(f"graph {key!r} was captured with {tuple(task.seq_lens.shape)} sequence lengths; "
                             f"got {tuple(seq_lens.shape)} (pad the batch to the size)")
        args = task.with_lengths(seq_lens)
        with self.device.graph_task_update(task.group, self.update_stream):
            getattr(self.ops, task.op)(*args)
        task.args = args

    def forget(self, key: Hashable) -> None:
        """Drop the tasks and workspaces recorded for graph ``key`` (its wrapper cleared it)."""
        self.tasks.pop(key, None)
        self._pinned.pop(key, None)
        for shape in [s for s in self.workspaces if s[0] == key]:
            del self.workspaces[shape]

    def clear(self) -> None:
        """Forget every recorded task."""
        self.tasks.clear()
        self.workspaces.clear()
        self._pinned.clear()


#: device -> its decode graph params (one per device, i.e. per graph pool)
_BY_DEVICE: "weakref.WeakKeyDictionary[Any, DecodeGraphParams]" = weakref.WeakKeyDictionary()


def decode_graph_params(device: Any, ops: Any) -> DecodeGraphParams:
    """The device's :class:`DecodeGraphParams`, made on first use and registered as its replay preparer."""
    from ascend_kernel_plugins.graph import register_replay_preparer

    params = _BY_DEVICE.get(device)
    if params is None:
        params = _BY_DEVICE[device] = DecodeGraphParams(device, ops)
        register_replay_preparer(device, params)
    elif params.ops is not ops:
        raise RuntimeError(f"decode graph params of {device!r} issue through the {getattr(params.ops, 'name', '?')} "
                           f"ops provider; a layer asked with {getattr(ops, 'name', '?')} (one provider per process)")
    return params


def _check_decode_capture(tokens: int, requests: int, kind: str) -> None:
    """Refuse a FULL capture that is not uniform single-token decode at the size vLLM's forward context names.

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
    if tokens != descriptor.num_tokens or tokens != requests:
        raise NotImplementedError(
            f"ACL FULL capture of {descriptor}: the Ascend {kind} backend captures single-token decode only "
            f"({tokens} tokens for {requests} requests); its lengths would be frozen in any other kernel")


def captured_decode(capture: Any, ops: Any, layer_name: str | None, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    num_heads: int, num_kv_heads: int, out: torch.Tensor) -> torch.Tensor:
    """One layer's attention inside an ACL FULL capture: single-token decode as an updatable task group."""
    _check_decode_capture(query.shape[0], seq_lens.shape[0], "paged-attention")
    return decode_graph_params(capture.device, ops).paged_attention(
        capture.graph, query, key_cache, value_cache, block_table, seq_lens, scale, num_heads, num_kv_heads, out,
        layer_name=layer_name)


def captured_mla_decode(capture: Any, ops: Any, layer_name: str | None, query: torch.Tensor,
                        kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        num_heads: int, v_head_size: int, out: torch.Tensor) -> torch.Tensor:
    """One MLA layer's decode inside an ACL FULL capture, as an updatable task group.

    ``seq_lens`` must be the host lengths the MLA builder keeps for decode
    (``decode.host_seq_lens``): that is where :meth:`DecodeGraphParams.before_replay`
    reads the step's lengths for this task.
    """
    _check_decode_capture(query.shape[0], seq_lens.shape[0], "MLA")
    return decode_graph_params(capture.device, ops).paged_attention_mla(
        capture.graph, query, kv_cache, block_table, seq_lens, scale, num_heads, v_head_size, out,
        layer_name=layer_name)

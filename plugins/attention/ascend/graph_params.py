"""FULL_DECODE_ONLY: keep a captured decode graph's attention tasks current with each batch's sequence lengths.

Why: Ascend's paged-attention kernel reads the sequence lengths on the host
while its task is built, so a task captured into an ACL graph holds the
lengths of the capture batch (see :mod:`ascend_kernel.ops.graph_ops`). Every
other input is read by address at replay; these are not. Before each replay
the attention tasks must be re-issued with the current lengths, as task
updates of the captured graph.

How the pieces call it (not wired into a live engine: no NPU to run it on):

* capture, per size: inside the wrapper's capture (``AclGraphWrapper`` with a
  FULL runtime mode), the Ascend impl's decode branch calls
  :meth:`DecodeGraphParams.paged_attention` instead of ``ops.paged_attention``;
  it writes into ``out`` (a buffer of the capture) as one task group per layer
  and records the group, its args and the lengths it holds, under the size;
* replay: after the runner has written the step's inputs into its persistent
  buffers and before the wrapper replays the graph of ``num_tokens``, it calls
  :meth:`DecodeGraphParams.update` with the step's host sequence lengths (one
  per padded request); every recorded task of that size is re-issued on the
  update stream inside ``device.graph_task_update``, which the replay waits for.

All device work goes through the device seam and the ops seam, so a recording
stand-in (``tests/graph_standin.py``) checks the protocol on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionTask:
    """One layer's captured paged-attention call: its task group and what it was issued with."""

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
    """Per captured size, the attention tasks of the decode graph, re-issued with new lengths before a replay."""

    def __init__(self, device: Any, ops: Any, update_stream: Any = None) -> None:
        self.device = device
        self.ops = ops
        #: updates go on a stream of their own; the replayed graph waits on each group's event
        self.update_stream = update_stream if update_stream is not None else device.new_stream()
        self.tasks: dict[int, list[AttentionTask]] = {}

    def paged_attention(self, num_tokens: int, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        num_heads: int, num_kv_heads: int, out: torch.Tensor) -> torch.Tensor:
        """Issue one layer's decode attention, inside the capture of size ``num_tokens``, as an updatable task.

        The workspace is sized now, from the capture batch's lengths: capture
        with the longest lengths a replay may see (vllm-ascend captures with a
        fixed large length for this reason).
        """
        args = (query, key_cache, value_cache, block_table, seq_lens, scale, num_heads, num_kv_heads)
        workspace = self.ops.paged_attention_workspace(*args, out)
        with self.device.graph_task_group(self.device.current_stream()) as group:
            self.ops.paged_attention_out(*args, out, workspace)
        self.tasks.setdefault(num_tokens, []).append(
            AttentionTask(group, query, key_cache, value_cache, block_table, seq_lens, scale, num_heads,
                          num_kv_heads, out, workspace))
        return out

    def update(self, num_tokens: int, seq_lens: torch.Tensor) -> int:
        """Re-issue every attention task captured at ``num_tokens`` with ``seq_lens``; returns how many.

        ``seq_lens`` is the step's host int32 lengths, one per (padded) request
        of the captured size; a shorter tensor is a caller error, refused here.
        """
        tasks = self.tasks.get(num_tokens, [])
        for task in tasks:
            if seq_lens.shape != task.seq_lens.shape:
                raise ValueError(f"graph of {num_tokens} tokens was captured with {tuple(task.seq_lens.shape)} "
                                 f"sequence lengths; got {tuple(seq_lens.shape)} (pad the batch to the size)")
            with self.device.graph_task_update(task.group, self.update_stream):
                self.ops.paged_attention_out(task.query, task.key_cache, task.value_cache, task.block_table,
                                             seq_lens, task.scale, task.num_heads, task.num_kv_heads, task.out,
                                             task.workspace)
            task.seq_lens = seq_lens
        return len(tasks)

    def clear(self) -> None:
        """Forget the recorded tasks (the wrapper's graphs were cleared)."""
        self.tasks.clear()

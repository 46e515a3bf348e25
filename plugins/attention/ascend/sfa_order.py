"""Sparse MLA layers read the indexer's selection only after the indexer wrote it, in compiled graphs too.

Why: vLLM's MLA wrapper calls the indexer (which fills the model's shared
``topk_indices_buffer`` through the opaque op ``ascend_kernel::sfa_indexer_select``)
and then the attention op, which reads that buffer from Python state inside
the op. The buffer is not an argument of the attention op, so a compiler sees
no dependency between the two, and inductor does move the selection after the
attention: measured on the tiny DeepSeek-V3.2 under cpu-graph's
full_decode_only, layer 0's attention read the prefill's stale selection and
greedy tokens differed from transformers from the first decode step.

The fix makes the dependency data: before the attention op runs, the layer's
``k_pe`` (the rotary key, ``[tokens, 1, rope_dim]``: the smallest of the
attention op's inputs) passes through ``ascend_kernel::sfa_after_selection``,
which reads the buffer and returns a copy of ``k_pe``. The attention op and its
KV-cache write take that copy, so any schedule runs selection first. Only
while tracing: an eager forward already runs in program order.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.compiler import is_compiling
from vllm.model_executor.layers.attention import MLAAttention

from ascend_kernel.ops.opaque import define_op_once


def _after_selection(k_pe: torch.Tensor, selection: torch.Tensor) -> torch.Tensor:
    return k_pe.clone()


def _after_selection_fake(k_pe: torch.Tensor, selection: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(k_pe)


define_op_once("sfa_after_selection", "Tensor k_pe, Tensor selection) -> Tensor",
               _after_selection, _after_selection_fake)


class SelectionOrderedMLAAttention(MLAAttention):
    """vLLM's MLA attention layer whose sparse variant orders its inputs after the indexer's selection."""

    def forward(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, *args: Any,
                **kwargs: Any) -> torch.Tensor:
        selection = getattr(self.impl, "topk_indices_buffer", None)
        if selection is not None and is_compiling():
            k_pe = torch.ops.ascend_kernel.sfa_after_selection(k_pe, selection)
        return super().forward(q, kv_c_normed, k_pe, *args, **kwargs)


@contextlib.contextmanager
def swapped() -> Iterator[list[str]]:
    """Inside: vLLM's MLA wrapper builds :class:`SelectionOrderedMLAAttention`; yields what was replaced."""
    from vllm.model_executor.layers import mla

    from ascend_kernel.scoped import attributes_swapped

    with attributes_swapped((mla, "MLAAttention", SelectionOrderedMLAAttention)):
        yield ["vllm.model_executor.layers.mla.MLAAttention"]

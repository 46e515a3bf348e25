"""Schemas and fake (shape-only) implementations of the MoE seam ops.

A fake says what an op returns (shapes, dtypes) without computing it; it is
what Dynamo and inductor run while tracing. They are written from the seam's
contracts (:mod:`ascend_kernel.ops.moe_reference`), once for every provider.
``moe_init_routing`` keeps a data-dependent number of rows: its fake answers
with an unbacked size, which the ops downstream carry along.
"""

from __future__ import annotations

import torch


def _gating(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (router_logits.shape[0], k)
    return (router_logits.new_empty(shape, dtype=torch.float32), router_logits.new_empty(shape, dtype=torch.int32))


def _init_routing(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                  active_expert_range: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kept = torch.library.get_ctx().new_dynamic_size()
    start, end = active_expert_range
    return (x.new_empty(kept, x.shape[-1]), x.new_empty(topk_ids.numel(), dtype=torch.int32),
            x.new_empty(end - start, dtype=torch.int64))


def _grouped_matmul(x: torch.Tensor, weight: torch.Tensor, group_counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[-1])


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


def _unpermute(expanded_out: torch.Tensor, expanded_row_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    return expanded_out.new_empty(topk_weights.shape[0], expanded_out.shape[-1])


def _grouped_mlp(rows: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 isa: str) -> torch.Tensor:
    return torch.empty_like(rows)


def _weighted_mlp(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor, isa: str) -> torch.Tensor:
    return torch.empty_like(x)


_OPS = {
    "moe_gating_top_k_softmax": ("Tensor router_logits, int k) -> (Tensor, Tensor)", _gating),
    "moe_init_routing": ("Tensor x, Tensor topk_ids, int num_experts, int[] active_expert_range) "
                         "-> (Tensor, Tensor, Tensor)", _init_routing),
    "grouped_matmul": ("Tensor x, Tensor weight, Tensor group_counts) -> Tensor", _grouped_matmul),
    "swiglu": ("Tensor x) -> Tensor", _swiglu),
    "moe_token_unpermute": ("Tensor expanded_out, Tensor expanded_row_idx, Tensor topk_weights) -> Tensor",
                            _unpermute),
    "cpu_grouped_expert_mlp": ("Tensor rows, Tensor counts, Tensor w13, Tensor w2, str isa) -> Tensor",
                               _grouped_mlp),
    "cpu_weighted_expert_mlp": ("Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor w13, Tensor w2, str isa) "
                                "-> Tensor", _weighted_mlp),
}

#: the seam's MoE ops by name: (schema after the provider handle, fake); :func:`ascend_kernel.ops.opaque.seam_op`
#: defines them (this module imports nothing of the kernel, so the two never import each other)
SCHEMAS = _OPS

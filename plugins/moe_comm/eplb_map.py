"""The kernel's MoE layer under vLLM's EPLB: logical expert ids to physical ones, and the load recorded.

vLLM's router maps and records with a Triton kernel on CUDA/XPU only; on
every other platform its ``eplb_map_to_physical_and_record`` returns the
logical ids unchanged (the kernel's platforms included). The kernel's MoE
layer therefore does it itself, in torch, with the same rule, from the
layer's ``EplbLayerState`` (views into vLLM's ``EplbState``, updated in
place by every rearrangement, so each batch reads the live map):

* token ``t``'s choice of logical expert ``e`` goes to replica
  ``hash(t) % replicas[e]`` of ``e`` (vLLM's Knuth multiplicative hash of the
  token index, so every rank of a batch picks the same replica);
* while ``should_record`` is set, each (token, expert) pair of the first
  ``num_unpadded_tokens`` tokens adds 1 to its physical expert's entry of
  ``expert_load_view``: padding never counts.

No value is read back to the host (the counts stay on the device).
"""

from __future__ import annotations

from typing import Any

import torch

#: floor(2**32 / golden ratio): vLLM's replica hash multiplier
KNUTH_MULTIPLIER = 2654435769


def to_physical(topk_ids: torch.Tensor, state: Any) -> torch.Tensor:
    """Physical expert ids [T, K] for logical ``topk_ids`` [T, K]; records the load of the unpadded tokens."""
    ids = topk_ids.long()
    tokens = torch.arange(ids.shape[0], device=ids.device, dtype=torch.int64).unsqueeze(1)
    replicas = state.logical_replica_count[ids].clamp_min(1)
    replica = ((tokens * KNUTH_MULTIPLIER) & 0xFFFFFFFF) % replicas
    physical = state.logical_to_physical_map[ids, replica]
    load = state.expert_load_view
    counted = (tokens < state.num_unpadded_tokens_tensors[0]) & state.should_record_tensor
    load.index_add_(0, physical.reshape(-1), counted.expand_as(physical).reshape(-1).to(load.dtype))
    return physical.to(topk_ids.dtype)

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

No value is read back to the host (the counts stay on the device). The
token indices and their hashes are the same for every layer and step of a
given size, so each layer computes them once per device (:class:`TokenHashes`),
as a table that grows to the largest batch (the profile run's, before any
graph capture) and is sliced per call: the map costs a few kernels per layer,
not a dozen.
"""

from __future__ import annotations

from typing import Any

import torch

#: floor(2**32 / golden ratio): vLLM's replica hash multiplier
KNUTH_MULTIPLIER = 2654435769


class TokenHashes:
    """Token indices 0..N-1 as [N, 1] and vLLM's replica hash of each, for the largest N asked, per device.

    One table per MoE layer's method (made when EPLB attaches to it), so it
    lives and dies with the model: no module-global state outlives an engine.
    """

    __slots__ = ("tables",)

    def __init__(self) -> None:
        self.tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, count: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``count`` token indices and their hashes (views of the device's table, grown on demand)."""
        table = self.tables.get(device)
        if table is None or table[0].shape[0] < count:
            tokens = torch.arange(max(count, 2 * (0 if table is None else table[0].shape[0])), device=device,
                                  dtype=torch.int64).unsqueeze(1)
            table = self.tables[device] = (tokens, (tokens * KNUTH_MULTIPLIER) & 0xFFFFFFFF)
        return table[0][:count], table[1][:count]


def to_physical(topk_ids: torch.Tensor, state: Any, hashes: TokenHashes | None = None) -> torch.Tensor:
    """Physical expert ids [T, K] for logical ``topk_ids`` [T, K]; records the load of the unpadded tokens.

    Every logical expert has at least one replica (vLLM's maps place each), so
    the replica count is never 0. Recording is on when the step's
    ``should_record`` is set: the limit is then the unpadded token count, else 0.
    """
    tokens, token_hash = (hashes or TokenHashes()).get(topk_ids.shape[0], topk_ids.device)
    replica = token_hash % state.logical_replica_count[topk_ids]
    physical = state.logical_to_physical_map[topk_ids, replica]
    load = state.expert_load_view
    recording = state.should_record_tensor
    # a host flag costs nothing to read: skip the count outside the window (on a device, reading would sync)
    if recording.device.type != "cpu" or bool(recording):
        limit = state.num_unpadded_tokens_tensors[0] * recording
        load.index_add_(0, physical.view(-1), (tokens < limit).to(load.dtype).expand_as(physical).reshape(-1))
    return physical.to(topk_ids.dtype)

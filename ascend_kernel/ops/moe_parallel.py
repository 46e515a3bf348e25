"""Who holds which tokens and which experts: the process groups an MoE comm method works in.

Two facts decide how a method moves tokens:

* the **EP group**: the ranks that split the experts among them (expert ``e``
  of the layer lives on one of them). Without expert parallelism it is this
  rank alone.
* how tokens are spread over it. Ranks of one *token replica* hold the same
  batch (tensor-parallel ranks after attention's all-reduce; under vLLM's
  data parallelism vLLM's own MoE runner has already gathered the DP batches,
  so the whole EP group is one replica). Methods that keep "their" tokens
  (all-to-all, MC2) give each replica member a disjoint shard of the batch;
  methods that gather (all-gather, naive multicast) exchange tokens across the
  **token group**: the ranks that hold *different* batches (trivial inside
  vLLM, the whole world in the two-process unit tests' data-parallel form).

A method's combine returns, for this rank's batch, the contribution of the
experts it computed; ranks of one replica add theirs up in the TP all-reduce
vLLM performs after every MoE layer (see docs/families/moe_comm.md: who reduces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class MoEParallel:
    """Process groups and ranks of one MoE layer (the same for every layer of a model)."""

    ep_group: Any
    ep_rank: int
    ep_size: int
    #: ranks holding the same batch split it into this many shards; this rank owns shard ``shard_rank``
    shard_rank: int
    shard_count: int
    #: ranks holding different batches (None and size 1 when every EP rank holds the same batch)
    token_group: Any = None
    token_rank: int = 0
    token_size: int = 1

    @classmethod
    def single(cls) -> "MoEParallel":
        """One rank, every expert local: methods compute without moving anything."""
        return cls(None, 0, 1, 0, 1)

    @classmethod
    def from_vllm(cls, moe_parallel_config: Any) -> "MoEParallel":
        """The groups of a vLLM MoE layer (its ``FusedMoEParallelConfig``)."""
        if not moe_parallel_config.use_ep or moe_parallel_config.ep_size == 1:
            return cls.single()
        from vllm.distributed import get_ep_group

        ep = get_ep_group()
        # every EP rank holds the same batch: TP ranks by construction, DP ranks after vLLM's naive dispatch
        return cls(ep.device_group, ep.rank_in_group, ep.world_size, ep.rank_in_group, ep.world_size)

    def shard(self, num_tokens: int) -> tuple[int, int]:
        """This rank's [start, end) rows of a batch its replica shares."""
        per_shard = -(-num_tokens // self.shard_count)
        start = min(self.shard_rank * per_shard, num_tokens)
        return start, min(start + per_shard, num_tokens)


def all_to_all_rows(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: Any,
                    size: int) -> torch.Tensor:
    """Variable-split all-to-all of rows: ``send_counts[d]`` leading rows go to rank ``d``."""
    if size == 1:
        return rows.clone()
    out = rows.new_empty(sum(recv_counts), *rows.shape[1:])
    dist.all_to_all_single(out, rows.contiguous(), recv_counts, send_counts, group=group)
    return out


def exchange_counts(send_counts: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """All-to-all of one count per destination: what each rank will receive from each other rank."""
    if size == 1:
        return send_counts.clone()
    out = torch.empty_like(send_counts)
    dist.all_to_all_single(out, send_counts.contiguous(), group=group)
    return out


def gather_sizes(num: int, group: Any, size: int, device: torch.device) -> list[int]:
    """Every rank's batch size in the token group (batches may differ between DP ranks)."""
    if size == 1:
        return [num]
    mine = torch.tensor([num], dtype=torch.int64, device=device)
    sizes = torch.empty(size, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(sizes, mine, group=group)
    return sizes.tolist()

"""The collectives of lm-head tensor parallelism over a group of data-parallel ranks (pure ``torch.distributed``).

Under pure DP each rank holds its own tokens. With an lm-head group of N
ranks, each rank keeps one vocabulary shard (1/N of the rows) of the lm head:

1. :func:`gather_hidden`: the group's hidden states are all-gathered; ranks
   hold different token counts (0 on an idle rank), so each pads to the
   group's largest count first;
2. each rank computes its vocabulary shard's logits for every token of the
   group (``project``);
3. :func:`redistribute_logits`: one all-to-all hands rank j the rows of its
   own tokens from every shard, so each rank ends with full-vocabulary logits
   for its own tokens only, and samples them as without lm-head TP.

The calls are the same on every backend: gloo on a CPU host, HCCL over the
group's device communicator on an NPU (``all_gather`` and
``all_to_all_single`` are HCCL collectives in torch_npu).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist


def token_counts(num_tokens: int, group: Any, world: int, device: torch.device) -> list[int]:
    """Every group rank's token count for this pass, in group-rank order."""
    mine = torch.tensor([num_tokens], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(counts, mine, group=group)
    return [int(c.item()) for c in counts]


def gather_hidden(hidden: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """``[world * width, hidden]``: rank j's tokens at rows ``j*width .. j*width + counts[j]``, zeros after."""
    width = max(counts)
    padded = hidden.new_zeros((width, hidden.shape[-1]))
    padded[: hidden.shape[0]] = hidden
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat(parts)


def redistribute_logits(shard_logits: torch.Tensor, counts: list[int], rank: int, group: Any) -> torch.Tensor:
    """From this rank's vocab shard for all the group's tokens to full-vocab logits for this rank's own tokens.

    ``shard_logits``: ``[world * width, vocab_shard]`` laid out as
    :func:`gather_hidden` laid out the tokens. The result is
    ``[counts[rank], world * vocab_shard]``, the shards in group-rank order
    (vLLM's vocabulary layout: shard r holds rows ``r*vocab_shard ..``).
    """
    world, width = len(counts), max(counts)
    send = shard_logits.contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # received chunk i: rank i's vocab shard of this rank's (padded) tokens
    full = received.view(world, width, -1).permute(1, 0, 2).reshape(width, -1)
    return full[: counts[rank]]


def lm_head_tp_logits(hidden: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor], group: Any,
                      world: int, rank: int) -> torch.Tensor:
    """This rank's full-vocab logits for its own tokens, its head holding one vocab shard (``project``).

    Every rank of the group must call it in the same pass (an idle rank with 0
    tokens too). Where no rank has a token, no projection or all-to-all runs.
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    counts = token_counts(flat.shape[0], group, world, flat.device)
    if max(counts) == 0:
        shard = project(flat)
        return shard.new_zeros((0, shard.shape[-1] * world))
    shard = project(gather_hidden(flat, counts, group))
    return redistribute_logits(shard, counts, rank, group)


def collective_bytes(tokens_per_rank: int, hidden: int, vocab_per_rank: int, world: int, hidden_bytes: int,
                     logits_bytes: int) -> int:
    """Bytes one rank receives in one pass (all ranks holding ``tokens_per_rank``): the all-gather's
    ``world - 1`` hidden blocks plus the all-to-all's ``world - 1`` logits blocks (its own block stays)."""
    gather = (world - 1) * tokens_per_rank * hidden * hidden_bytes
    exchange = (world - 1) * tokens_per_rank * vocab_per_rank * logits_bytes
    return gather + exchange

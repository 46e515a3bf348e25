"""The torch_npu provider's MoE ops: the fused Ascend kernels adapted to the seam's contracts.

Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps`, which sets ``self._npu``
(the torch_npu module); nothing here imports torch_npu, so this module loads
anywhere. Not run in this project's CI (no NPU). Where a kernel's documented
convention differs from the seam's (see
:mod:`ascend_kernel.ops.moe_reference` for the contracts), the adaptation is
done here and said next to the call. Empty batches never reach a kernel (the
kernels reject empty tensors); they are answered directly. Each op runs
behind the same registered torch op as the reference provider's
(:mod:`ascend_kernel.ops.opaque`), so the host reads some adaptations need
stay out of traced graphs.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.ops.opaque import seam_op


class TorchNpuMoEOps:
    _npu: Any

    @seam_op("moe_gating_top_k_softmax")
    def moe_gating_top_k_softmax(self, router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax (float32) + top-k, descending, not renormalised.

        ``npu_moe_gating_top_k_softmax`` answers (y, expert_idx, row_idx) with
        y in the input's dtype: the logits go in as float32 so the weights are
        float32 softmax values; row_idx (the pairs' column-major numbering) is
        not part of the seam.
        """
        num_tokens = router_logits.shape[0]
        if num_tokens == 0:
            return (router_logits.new_empty(0, k, dtype=torch.float32),
                    router_logits.new_empty(0, k, dtype=torch.int32))
        weights, ids, _ = self._npu.npu_moe_gating_top_k_softmax(router_logits.float(), finished=None, k=k)
        return weights.float(), ids.to(torch.int32)

    @seam_op("moe_init_routing")
    def moe_init_routing(self, x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                         active_expert_range: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pairs grouped by expert, only experts in [start, end) kept (see the reference for the contract).

        ``npu_moe_init_routing_v2`` in dropless mode (drop_pad_mode 0, no
        quantisation, quant_mode -1) with active_num = T * k (every pair may
        be kept) already follows the seam's conventions: row_idx_type 0 is the
        gather map (pair i -> row, -1 for pairs outside the range) and
        expert_tokens_num_type 1 with the flag set gives per-expert counts for
        the range (int64). Its expanded_x has T * k rows of which the first
        ``sum(counts)`` are valid; the seam returns exactly those, which costs
        one device-to-host read of the count.
        """
        start, end = (int(v) for v in active_expert_range)
        if not 0 <= start <= end <= num_experts:
            raise ValueError(f"active_expert_range {active_expert_range} is not within [0, {num_experts}]")
        num_tokens, k = topk_ids.shape
        if num_tokens == 0 or start == end:  # nothing can be kept; the kernel takes neither case
            return (x.new_empty(0, x.shape[-1]),
                    torch.full((num_tokens * k,), -1, dtype=torch.int32, device=x.device),
                    torch.zeros(end - start, dtype=torch.int64, device=x.device))
        expanded_x, row_idx, counts, _ = self._npu.npu_moe_init_routing_v2(
            x, topk_ids.to(torch.int32), scale=None, offset=None, active_num=num_tokens * k, expert_capacity=-1,
            expert_num=num_experts, drop_pad_mode=0, expert_tokens_num_type=1, expert_tokens_num_flag=True,
            quant_mode=-1, active_expert_range=[start, end], row_idx_type=0)
        counts = counts.to(torch.int64)
        kept = int(counts.sum())
        return expanded_x[:kept], row_idx.to(torch.int32), counts

    @seam_op("grouped_matmul")
    def grouped_matmul(self, x: torch.Tensor, weight: torch.Tensor, group_counts: torch.Tensor) -> torch.Tensor:
        """Rows in consecutive groups, group g times ``weight[g]`` ([K, N]); rows past the groups give zeros.

        ``npu_grouped_matmul`` with one x, one [G, K, N] weight and one output
        (split_item 2/3 give a single output; group_type 0 groups the rows)
        returns a list of one tensor. It requires the groups to cover every
        row of x, and a group list of per-group counts (group_list_type 1) may
        not have length 1, so the counts go as their running sum
        (group_list_type 0) and any rows past the groups are zeroed and folded
        into the last group, where zero rows give zero outputs: no
        device-to-host read needed.
        """
        rows, groups = x.shape[0], weight.shape[0]
        if rows == 0 or groups == 0:
            return x.new_zeros(rows, weight.shape[-1])
        ends = torch.cumsum(group_counts.to(device=x.device, dtype=torch.int64), 0)
        x = x.masked_fill((torch.arange(rows, device=x.device) >= ends[-1]).unsqueeze(1), 0)
        ends = torch.cat([ends[:-1], ends.new_full((1,), rows)])
        return self._npu.npu_grouped_matmul(x=[x], weight=[weight], split_item=2, group_type=0,
                                            group_list_type=0, group_list=ends)[0]

    @seam_op("swiglu")
    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(first half) * second half``: ``npu_swiglu`` computes swish(A) * B with A the first half of ``dim``.

        The kernel takes no empty and no non-contiguous tensor.
        """
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)
        return self._npu.npu_swiglu(x.contiguous(), dim=-1)

    @seam_op("moe_token_unpermute")
    def moe_token_unpermute(self, expanded_out: torch.Tensor, expanded_row_idx: torch.Tensor,
                            topk_weights: torch.Tensor) -> torch.Tensor:
        """``out[t] = sum_j w[t, j] * expanded_out[row of (t, j)]``, dropped (-1) pairs adding nothing.

        ``npu_moe_token_unpermute`` gathers ``out[t] = sum_j probs[t, j] *
        tokens[idx[t * k + j]]``, the seam's rule, but wants ``tokens`` with
        exactly T * k rows and ``idx`` a permutation of [0, T * k) (no -1, no
        repeats). So the n kept rows are followed by T * k - n zero rows, one
        per dropped pair, and the d-th dropped pair points at row n + d (its
        weight is zeroed as well). Tokens and weights go in as float32 so the
        sum accumulates in float32; the result is cast back.
        """
        num_tokens, k = topk_weights.shape
        hidden = expanded_out.shape[-1]
        if num_tokens == 0:
            return expanded_out.new_zeros(0, hidden)
        idx = expanded_row_idx.reshape(-1)
        dropped = idx < 0
        pad_rows = expanded_out.shape[0] + torch.cumsum(dropped.to(torch.int64), 0) - 1
        idx = torch.where(dropped, pad_rows, idx.to(torch.int64)).to(torch.int32)
        pad = expanded_out.new_zeros(num_tokens * k - expanded_out.shape[0], hidden, dtype=torch.float32)
        tokens = torch.cat([expanded_out.float(), pad])
        probs = topk_weights.float().masked_fill(dropped.view(num_tokens, k), 0.0)
        out = self._npu.npu_moe_token_unpermute(tokens, idx, probs=probs, padded_mode=False, restore_shape=None)
        return out.to(expanded_out.dtype)

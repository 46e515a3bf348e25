"""The torch_npu provider: the real Ascend kernels with their documented argument conventions.

Not run in this project's CI (no NPU). Outputs are preallocated and passed as
``out=`` where the ops require it, as torch_npu's private attention ops do.
"""

from __future__ import annotations

import torch

from ascend_kernel.ops.graph_ops import (
    PAGED_ATTENTION_MLA_OUT_SCHEMA,
    PAGED_ATTENTION_OUT_SCHEMA,
    RESHAPE_AND_CACHE_SCHEMA,
    no_result,
)
from ascend_kernel.ops.fused_npu import TorchNpuFusedOps
from ascend_kernel.ops.lora_npu import TorchNpuLoRAOps
from ascend_kernel.ops.matmul_comm_npu import TorchNpuMatmulCommOps
from ascend_kernel.ops.mc2_npu import TorchNpuMC2Ops
from ascend_kernel.ops.mm_npu import TorchNpuMMOps
from ascend_kernel.ops.moe_npu import TorchNpuMoEOps
from ascend_kernel.ops.opaque import seam_op
from ascend_kernel.ops.quant_npu import TorchNpuQuantOps


class TorchNpuOps(TorchNpuMoEOps, TorchNpuMC2Ops, TorchNpuQuantOps, TorchNpuLoRAOps, TorchNpuFusedOps,
                  TorchNpuMMOps, TorchNpuMatmulCommOps):
    name = "torch_npu"

    def __init__(self) -> None:
        import torch_npu

        self._npu = torch_npu

    @seam_op("reshape_and_cache", RESHAPE_AND_CACHE_SCHEMA, no_result)
    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        self._npu._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                                         slot_indices=slot_mapping.to(torch.int32))

    def write_cache(self, values, cache, slot_mapping) -> None:
        # scatter rows into the cache seen as [slots, heads, d]; padding slots (negative) are dropped first
        keep = slot_mapping >= 0
        flat = cache.view(-1, *cache.shape[2:])
        self._npu.npu_scatter_nd_update_(flat, slot_mapping[keep].view(-1, 1).to(torch.int64), values[keep])

    def flash_attention(self, query, key, value, mask, seq_lens, scale, num_heads, num_kv_heads):
        out = torch.empty_like(query)
        self._npu._npu_flash_attention(query=query, key=key, value=value, mask=mask, seq_len=seq_lens,
                                       scale_value=scale, num_heads=num_heads, num_kv_heads=num_kv_heads, out=out)
        return out

    def ragged_attention_lse(self, query, key, value, q_starts, kv_starts, scale, causal):
        mask = None
        if causal:  # sparse_mode 3 reads a compressed 2048 x 2048 causal mask
            mask = torch.ones(2048, 2048, dtype=torch.bool, device=query.device).triu(1)
        out, lse = self._npu.npu_fused_infer_attention_score(
            query, key, value, num_heads=query.shape[1], num_key_value_heads=key.shape[1], input_layout="TND",
            scale=scale, atten_mask=mask, sparse_mode=3 if causal else 0,
            actual_seq_lengths=q_starts[1:].tolist(), actual_seq_lengths_kv=kv_starts[1:].tolist(),
            softmax_lse_flag=True)
        return out, lse.squeeze(-1).transpose(0, 1).float()

    def paged_attention(self, query, key_cache, value_cache, block_table, context_lens, scale, num_heads,
                        num_kv_heads):
        out = torch.empty_like(query)
        self._npu._npu_paged_attention(query=query, key_cache=key_cache, value_cache=value_cache,
                                       num_kv_heads=num_kv_heads, num_heads=num_heads, scale_value=scale,
                                       block_table=block_table, context_lens=context_lens, out=out)
        return out

    @seam_op("paged_attention_out", PAGED_ATTENTION_OUT_SCHEMA, no_result)
    def paged_attention_out(self, query, key_cache, value_cache, block_table, context_lens, scale, num_heads,
                            num_kv_heads, out, workspace) -> None:
        # in a captured graph the task keeps ``workspace`` (sized at capture for the largest lengths)
        extra = {} if workspace is None else {"workspace": workspace}
        self._npu._npu_paged_attention(query=query, key_cache=key_cache, value_cache=value_cache,
                                       num_kv_heads=num_kv_heads, num_heads=num_heads, scale_value=scale,
                                       block_table=block_table, context_lens=context_lens, out=out, **extra)

    def paged_attention_workspace(self, query, key_cache, value_cache, block_table, context_lens, scale, num_heads,
                                  num_kv_heads, out):
        return self._npu._npu_paged_attention_get_workspace(
            query=query, key_cache=key_cache, value_cache=value_cache, num_kv_heads=num_kv_heads,
            num_heads=num_heads, scale_value=scale, block_table=block_table, context_lens=context_lens, out=out)

    def paged_attention_splitfuse(self, query, key_cache, value_cache, mask, block_table, query_lens, context_lens,
                                  scale, num_heads, num_kv_heads):
        out = torch.empty_like(query)
        self._npu._npu_paged_attention_splitfuse(query=query, key_cache=key_cache, value_cache=value_cache,
                                                 mask=mask, block_table=block_table, seq_len=query_lens,
                                                 context_lens=context_lens, num_kv_heads=num_kv_heads,
                                                 num_heads=num_heads, scale_value=scale, out=out)
        return out

    def flash_attention_qlens(self, query, key_cache, value_cache, block_table, mask, query_lens, context_lens,
                              scale, num_heads, num_kv_heads):
        out = torch.empty_like(query)
        self._npu._npu_flash_attention_qlens(query=query, key_cache=key_cache, value_cache=value_cache,
                                             block_table=block_table, mask=mask, seq_len=query_lens,
                                             context_lens=context_lens, num_kv_heads=num_kv_heads,
                                             num_heads=num_heads, scale_value=scale, out=out)
        return out

    def paged_attention_mla(self, query, kv_cache, block_table, context_lens, scale, num_heads, v_head_size):
        out = query.new_empty(query.shape[0], num_heads, v_head_size)
        self._npu._npu_paged_attention_mla(query=query, key_cache=kv_cache, num_kv_heads=1, num_heads=num_heads,
                                           scale_value=scale, block_table=block_table, context_lens=context_lens,
                                           mla_vheadsize=v_head_size, out=out)
        return out

    @seam_op("paged_attention_mla_out", PAGED_ATTENTION_MLA_OUT_SCHEMA, no_result)
    def paged_attention_mla_out(self, query, kv_cache, block_table, context_lens, scale, num_heads, v_head_size,
                                out) -> None:
        # the kernel's documented form: one latent KV head, values = the first mla_vheadsize columns; no workspace
        self._npu._npu_paged_attention_mla(query=query, key_cache=kv_cache, num_kv_heads=1, num_heads=num_heads,
                                           scale_value=scale, block_table=block_table, context_lens=context_lens,
                                           mla_vheadsize=v_head_size, out=out)

    def lightning_indexer(self, query, key_cache, weights, query_lens, context_lens, block_table, sparse_count):
        # CANN custom op (registered by the Ascend custom-ops package under torch.ops.custom); it takes the
        # head weights in the query's dtype and answers [T, key heads (1), sparse_count]: the seam's is [T, sparse_count]
        selected = torch.ops.custom.npu_lightning_indexer(
            query, key_cache, weights.to(query.dtype),
            actual_seq_lengths_query=torch.cumsum(query_lens, 0).to(query.device, torch.int32),
            actual_seq_lengths_key=context_lens.to(query.device, torch.int32), block_table=block_table,
            layout_query="TND", layout_key="PA_BSND", sparse_count=sparse_count, sparse_mode=3)
        return selected.squeeze(1)

    def sparse_attention_mla(self, query, query_rope, nope_cache, rope_cache, sparse_indices, query_lens,
                             block_table, context_lens, scale):
        return torch.ops.custom.npu_sparse_flash_attention(
            query, nope_cache, nope_cache, sparse_indices.unsqueeze(1), scale, 1, block_table=block_table,
            actual_seq_lengths_query=torch.cumsum(query_lens, 0).to(torch.int32),
            actual_seq_lengths_kv=context_lens.to(torch.int32), query_rope=query_rope, key_rope=rope_cache,
            layout_query="TND", layout_kv="PA_BSND", sparse_mode=3)

    def quantize_per_token_head(self, x):
        # npu_dynamic_quant quantises each row of the last dim (fp16/bf16 input): (int8 y, float32 scale)
        if x.dtype == torch.float32:
            x = x.to(torch.bfloat16)
        return self._npu.npu_dynamic_quant(x)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox_style) -> None:
        self._npu._npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)

    def top_k_top_p(self, logits, k, p):
        # npu_top_k_top_p documents vLLM's formula (stable ascending sort, keep >= k-th value, drop cumulative
        # mass <= 1 - p, keep the last) and serves k in [1, 1024] with k <= vocab, p in [0, 1], both given.
        # With p absent the reference top-k (exact, no sort) runs on device rather than the op with p = 1, which
        # would also drop zero-probability tokens. Rows the op cannot serve (no top-k on a vocabulary over 1024,
        # k over 1024, p outside [0, 1]) get the reference math on device, the others the op.
        from ascend_kernel.ops.reference import ReferenceOps as reference

        top_k_limit = 1024
        if k is None and p is None:
            return logits
        if p is None:
            return reference.top_k_top_p(logits, k, p)
        vocab = logits.shape[-1]
        if k is None:
            k = torch.full((logits.shape[0],), vocab, dtype=torch.long, device=logits.device)
        k = k.to(torch.long)
        k = torch.where((k <= 0) | (k > vocab), vocab, k)  # vocab: no top-k for this row
        servable = (k <= min(vocab, top_k_limit)) & (p >= 0) & (p <= 1)
        if bool(servable.all()):
            return self._npu.npu_top_k_top_p(logits, p.to(logits.dtype), k.to(torch.int32))
        out = torch.empty_like(logits)
        by_op, by_ref = servable.nonzero().squeeze(1), (~servable).nonzero().squeeze(1)
        out[by_ref] = reference.top_k_top_p(logits[by_ref], k[by_ref], p[by_ref])
        if by_op.numel():
            out[by_op] = self._npu.npu_top_k_top_p(logits[by_op], p[by_op].to(logits.dtype),
                                                   k[by_op].to(torch.int32))
        return out

    def format_cast(self, tensor, acl_format):
        return self._npu.npu_format_cast(tensor, acl_format)

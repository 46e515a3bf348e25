"""Pure-torch reference implementations of the Ascend attention kernels.

Same signatures and semantics as :mod:`ascend_kernel.ops.npu`: written for
clarity (loops over requests, float32 accumulation), not speed. Each op is
tested against naive float64 attention and torch's SDPA.
"""

from __future__ import annotations

import torch

from ascend_kernel.ops.graph_ops import (
    PAGED_ATTENTION_MLA_OUT_SCHEMA,
    PAGED_ATTENTION_OUT_SCHEMA,
    RESHAPE_AND_CACHE_SCHEMA,
    no_result,
)
from ascend_kernel.ops.fused_reference import ReferenceFusedOps
from ascend_kernel.ops.lora_reference import ReferenceLoRAOps
from ascend_kernel.ops.matmul_comm import ReferenceMatmulCommOps
from ascend_kernel.ops.mc2_reference import ReferenceMC2Ops
from ascend_kernel.ops.mm_reference import ReferenceMMOps
from ascend_kernel.ops.moe_reference import ReferenceMoEOps
from ascend_kernel.ops.opaque import seam_op
from ascend_kernel.ops.quant_reference import ReferenceQuantOps


def _gqa(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat KV heads ``[..., kv_heads, d]`` to ``num_heads`` (grouped-query attention)."""
    kv_heads = x.shape[-2]
    if num_heads % kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {kv_heads}")
    return x.repeat_interleave(num_heads // kv_heads, dim=-2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, H, d], k/v [m, H, d], allowed [n, m] bool -> [n, H, d] (float32 math)."""
    scores = torch.einsum("nhd,mhd->hnm", q.float(), k.float()) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no allowed key gives zeros
    return torch.einsum("hnm,mhd->nhd", probs, v.float()).to(q.dtype)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence from a paged cache -> [length, kv_heads, d]."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-length // block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


class ReferenceOps(ReferenceMoEOps, ReferenceMC2Ops, ReferenceQuantOps, ReferenceLoRAOps, ReferenceFusedOps,
                   ReferenceMMOps, ReferenceMatmulCommOps):
    name = "reference"

    @seam_op("reshape_and_cache", RESHAPE_AND_CACHE_SCHEMA, no_result)
    def reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write token ``i``'s K/V ([T, kv_heads, d]) to slot ``slot_mapping[i]`` of the caches."""
        slots = slot_mapping.long()
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
        block_size = key_cache.shape[1]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, offsets] = key.to(key_cache.dtype)
        value_cache[blocks, offsets] = value.to(value_cache.dtype)

    def write_cache(self, values: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """One paged cache's write: token ``i``'s row ``[heads, d]`` to slot ``slot_mapping[i]`` (SFA's indexer keys)."""
        slots = slot_mapping.long()
        keep = slots >= 0
        block_size = cache.shape[1]
        cache[slots[keep] // block_size, slots[keep] % block_size] = values[keep].to(cache.dtype)

    def flash_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float, num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """Prefill without cache: each sequence attends to itself under ``mask`` ([S, S] flags)."""
        out = torch.empty_like(query)
        start = 0
        for length in seq_lens.tolist():
            end = start + length
            allowed = mask[:length, :length] == 0
            out[start:end] = _attend(query[start:end], _gqa(key[start:end], num_heads),
                                     _gqa(value[start:end], num_heads), allowed, scale)
            start = end
        return out

    def ragged_attention_lse(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             q_starts: torch.Tensor, kv_starts: torch.Tensor, scale: float,
                             causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Varlen attention that also returns the log-sum-exp, so partial results can be merged.

        Request ``r`` attends its queries ``q_starts[r]:q_starts[r+1]`` to keys
        ``kv_starts[r]:kv_starts[r+1]``; causal aligns the last query with the
        last key. Returns out [T, H, Dv] and lse [H, T] (float32).
        """
        out = query.new_empty(query.shape[0], query.shape[1], value.shape[-1])
        lse = torch.empty(query.shape[1], query.shape[0], dtype=torch.float32, device=query.device)
        q_starts, kv_starts = q_starts.tolist(), kv_starts.tolist()
        for r in range(len(q_starts) - 1):
            qs, qe, ks, ke = q_starts[r], q_starts[r + 1], kv_starts[r], kv_starts[r + 1]
            scores = torch.einsum("nhd,mhd->hnm", query[qs:qe].float(), key[ks:ke].float()) * scale
            if causal:
                shift = (ke - ks) - (qe - qs)
                blocked = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=query.device).triu(1 + shift)
                scores = scores.masked_fill(blocked, float("-inf"))
            lse[:, qs:qe] = torch.logsumexp(scores, dim=-1)
            out[qs:qe] = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), value[ks:ke].float()).to(out.dtype)
        return out, lse

    def paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_table: torch.Tensor, context_lens: torch.Tensor, scale: float, num_heads: int,
                        num_kv_heads: int) -> torch.Tensor:
        """Decode: one query token per sequence over its ``context_lens`` cached tokens."""
        out = torch.empty_like(query)
        for i, length in enumerate(context_lens.tolist()):
            k = _gqa(_gather(key_cache, block_table[i], length), num_heads)
            v = _gqa(_gather(value_cache, block_table[i], length), num_heads)
            allowed = torch.ones(1, length, dtype=torch.bool, device=query.device)
            out[i : i + 1] = _attend(query[i : i + 1], k, v, allowed, scale)
        return out

    @seam_op("paged_attention_out", PAGED_ATTENTION_OUT_SCHEMA, no_result)
    def paged_attention_out(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            block_table: torch.Tensor, context_lens: torch.Tensor, scale: float, num_heads: int,
                            num_kv_heads: int, out: torch.Tensor, workspace: torch.Tensor | None) -> None:
        """:meth:`paged_attention` written into ``out`` (a captured graph's buffer); no workspace is needed here."""
        out.copy_(self.paged_attention(query, key_cache, value_cache, block_table, context_lens, scale, num_heads,
                                       num_kv_heads))

    def paged_attention_workspace(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  block_table: torch.Tensor, context_lens: torch.Tensor, scale: float,
                                  num_heads: int, num_kv_heads: int, out: torch.Tensor) -> torch.Tensor | None:
        """The workspace a captured paged-attention task keeps (none for the reference)."""
        return None

    def paged_attention_splitfuse(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  mask: torch.Tensor, block_table: torch.Tensor, query_lens: torch.Tensor,
                                  context_lens: torch.Tensor, scale: float, num_heads: int,
                                  num_kv_heads: int) -> torch.Tensor:
        """Chunked prefill / mixed batches over the paged cache; ``mask`` has one row per query token."""
        out = torch.empty_like(query)
        start = 0
        for i, (q_len, length) in enumerate(zip(query_lens.tolist(), context_lens.tolist())):
            end = start + q_len
            k = _gqa(_gather(key_cache, block_table[i], length), num_heads)
            v = _gqa(_gather(value_cache, block_table[i], length), num_heads)
            allowed = mask[start:end, :length] == 0
            out[start:end] = _attend(query[start:end], k, v, allowed, scale)
            start = end
        return out

    def flash_attention_qlens(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                              block_table: torch.Tensor, mask: torch.Tensor, query_lens: torch.Tensor,
                              context_lens: torch.Tensor, scale: float, num_heads: int,
                              num_kv_heads: int) -> torch.Tensor:
        """Prefill of new tokens over a cached prefix (PrefillCacheHit) with a compressed mask.

        Request ``i``'s ``query_lens[i]`` tokens are the last of its
        ``context_lens[i]`` (already cached) tokens. ``mask`` is one ``[B, B]``
        tile the kernel repeats along the diagonal by absolute position: a key
        in an earlier tile than its query is visible, in a later tile hidden,
        in the same tile visible when ``mask[q % B, k % B]`` is 0.
        """
        tile = mask.shape[0]
        hidden = mask != 0
        out = torch.empty_like(query)
        start = 0
        for i, (q_len, length) in enumerate(zip(query_lens.tolist(), context_lens.tolist())):
            k = _gqa(_gather(key_cache, block_table[i], length), num_heads)
            v = _gqa(_gather(value_cache, block_table[i], length), num_heads)
            q_pos = torch.arange(length - q_len, length, device=query.device)
            k_pos = torch.arange(length, device=query.device)
            q_tile, k_tile = (q_pos // tile)[:, None], (k_pos // tile)[None, :]
            same = hidden[(q_pos % tile)[:, None], (k_pos % tile)[None, :]]
            allowed = (k_tile < q_tile) | ((k_tile == q_tile) & ~same)
            out[start : start + q_len] = _attend(query[start : start + q_len], k, v, allowed, scale)
            start += q_len
        return out

    def paged_attention_mla(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                            context_lens: torch.Tensor, scale: float, num_heads: int,
                            v_head_size: int) -> torch.Tensor:
        """MLA decode (weight-absorbed MQA) over the latent cache.

        ``query`` [B, heads, rank + rope]; ``kv_cache`` [blocks, block_size, 1, rank + rope];
        keys are whole cache rows, values their first ``v_head_size`` (= kv_lora_rank)
        columns. Returns [B, heads, v_head_size].
        """
        out = query.new_empty(query.shape[0], num_heads, v_head_size)
        for i, length in enumerate(context_lens.tolist()):
            rows = _gather(kv_cache, block_table[i], length).expand(length, num_heads, kv_cache.shape[-1])
            allowed = torch.ones(1, length, dtype=torch.bool, device=query.device)
            out[i : i + 1] = _attend(query[i : i + 1], rows, rows[..., :v_head_size], allowed, scale)
        return out

    @seam_op("paged_attention_mla_out", PAGED_ATTENTION_MLA_OUT_SCHEMA, no_result)
    def paged_attention_mla_out(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                                context_lens: torch.Tensor, scale: float, num_heads: int, v_head_size: int,
                                out: torch.Tensor) -> None:
        """:meth:`paged_attention_mla` written into ``out`` (a captured graph's buffer)."""
        out.copy_(self.paged_attention_mla(query, kv_cache, block_table, context_lens, scale, num_heads,
                                           v_head_size))

    def lightning_indexer(self, query: torch.Tensor, key_cache: torch.Tensor, weights: torch.Tensor,
                          query_lens: torch.Tensor, context_lens: torch.Tensor, block_table: torch.Tensor,
                          sparse_count: int) -> torch.Tensor:
        """SFA's token selection: for each query token, the ``sparse_count`` best earlier positions.

        ``query`` [T, G, D] (indexer heads), ``key_cache`` [blocks, block_size, 1, D],
        ``weights`` [T, G]. Score of position j: sum_g w_g * relu(q_g . k_j), causal
        (a query at position p sees 0..p). Returns [T, sparse_count] positions, -1 padded.
        """
        out = torch.full((query.shape[0], sparse_count), -1, dtype=torch.int32, device=query.device)
        start = 0
        for i, (q_len, length) in enumerate(zip(query_lens.tolist(), context_lens.tolist())):
            keys = _gather(key_cache, block_table[i], length)[:, 0].float()  # [length, D]
            for t in range(q_len):
                pos = length - q_len + t
                scores = (torch.relu(query[start + t].float() @ keys[: pos + 1].T) * weights[start + t, :, None]).sum(0)
                k = min(sparse_count, pos + 1)
                out[start + t, :k] = scores.topk(k).indices.to(torch.int32)
            start += q_len
        return out

    def sparse_attention_mla(self, query: torch.Tensor, query_rope: torch.Tensor, nope_cache: torch.Tensor,
                             rope_cache: torch.Tensor, sparse_indices: torch.Tensor, query_lens: torch.Tensor,
                             block_table: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """MLA attention of each query token over only its selected positions (values = the latent)."""
        out = query.new_empty(query.shape)
        start = 0
        for i, (q_len, length) in enumerate(zip(query_lens.tolist(), context_lens.tolist())):
            nope = _gather(nope_cache, block_table[i], length)[:, 0]
            rope = _gather(rope_cache, block_table[i], length)[:, 0]
            for t in range(q_len):
                idx = sparse_indices[start + t]
                idx = idx[idx >= 0].long()
                keys = torch.cat([nope[idx], rope[idx]], dim=-1).unsqueeze(1).expand(-1, query.shape[1], -1)
                q = torch.cat([query[start + t], query_rope[start + t]], dim=-1).unsqueeze(0)
                allowed = torch.ones(1, idx.numel(), dtype=torch.bool, device=query.device)
                out[start + t] = _attend(q, keys, keys[..., : query.shape[-1]], allowed, scale)[0]
            start += q_len
        return out

    def quantize_per_token_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Symmetric int8 per row of the last dim: ``x [..., D]`` -> (int8 ``[..., D]``, float32 scale ``[...]``).

        scale = max(|x|) / 127 (at least 1e-6); values are ``x / scale`` rounded
        half away from zero and clamped to [-128, 127]: vLLM's
        ``int8_per_token_head`` convention, so ``q * scale`` recovers ``x``
        within half a step.
        """
        xf = x.float()
        scale = (xf.abs().amax(dim=-1) / 127.0).clamp(min=1e-6)
        scaled = xf * (1.0 / scale).unsqueeze(-1)
        rounded = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
        return rounded.clamp(-128, 127).to(torch.int8), scale

    def rotary_embedding(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                         cos_sin_cache: torch.Tensor, is_neox_style: bool) -> None:
        """In place on ``query``/``key`` ([T, heads * head_size]); cache rows are [cos | sin] halves."""
        cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
        for x in (query, key):
            view = x.view(x.shape[0], -1, head_size)
            rot = view[..., : cos.shape[-1] * 2].float()
            if is_neox_style:
                a, b = rot.chunk(2, dim=-1)
            else:
                a, b = rot[..., 0::2], rot[..., 1::2]
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            ra, rb = a * c - b * s, b * c + a * s
            new = torch.cat((ra, rb), dim=-1) if is_neox_style else torch.stack((ra, rb), dim=-1).flatten(-2)
            view[..., : cos.shape[-1] * 2] = new.to(x.dtype)

    @staticmethod  # the NPU provider runs it for rows its op cannot serve
    def top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        """Mask (to -inf) what vLLM's top-k/top-p filter drops; the kept entries keep their value.

        Per row, ``k`` (None, or ``k <= 0`` / ``k >= vocab``: no top-k) keeps
        every token not below the k-th largest value, ties included; ``p``
        (None: no top-p) then drops, in ascending order of value, each token
        whose running probability mass (over the top-k survivors, summed from
        the smallest up) is at most ``1 - p``; the largest token always
        survives. ``p = 1`` drops only tokens whose probability is exactly 0.
        This is vLLM's ``apply_top_k_top_p`` and ``npu_top_k_top_p``'s
        documented formula, computed the same way (one ascending sort of the
        row, softmax and cumsum in the logits' dtype), so the kept set is the
        same bit for bit on a given device; tokens tied across the top-p
        boundary are ordered by ``torch.sort`` as in vLLM (``npu_top_k_top_p``
        documents a stable sort: the lower token id is dropped first). With
        ``p`` absent the top-k needs no sort. Returns a new tensor.
        """
        if k is None and p is None:
            return logits
        vocab = logits.shape[-1]
        if k is not None:
            k = k.to(torch.long)
            k = torch.where((k <= 0) | (k > vocab), vocab, k)
        if p is None:
            # the k-th largest value per row from a partial top-k; k == vocab filters nothing
            no_top_k = k == vocab
            kth = logits.topk(int(k.masked_fill(no_top_k, 1).max()), dim=-1).values
            kth = kth.gather(1, (k.masked_fill(no_top_k, 1) - 1).unsqueeze(1))
            kth = kth.masked_fill(no_top_k.unsqueeze(1), float("-inf"))
            return logits.masked_fill(logits < kth, float("-inf"))
        ordered, order = logits.sort(dim=-1)  # ascending, as vLLM sorts
        if k is not None:
            kth = ordered.gather(1, (vocab - k).unsqueeze(1))
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        mass = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = mass <= (1 - p).unsqueeze(1)
        drop[:, -1] = False  # the best token always survives
        return logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))

    def format_cast(self, tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
        return tensor

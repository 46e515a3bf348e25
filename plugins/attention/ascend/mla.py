"""The Ascend MLA backend (decode and cache writes over the ops seam).

Built on vLLM's MLA scaffolding (``MLACommonBackend``/``MLACommonImpl``):
vLLM's ``MLAAttention`` layer orchestrates weight-absorbed decode (MQA) and
non-absorbed prefill (MHA). This backend supplies

* the cache write: the latent ``kv_c`` and rotary key ``k_pe`` go to the
  layer's nope and rope caches (the MLA layout's split of one page) with the
  same ``reshape_and_cache`` kernel as standard attention;
* the decode: ``paged_attention_mla`` over the latent cache.

* the prefill (:class:`AscendMLAPrefillBackend`): causal flash attention over
  the new tokens, chosen through the platform's MLA-prefill seam.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, MultipleOf
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops


class AscendMLABackend(MLACommonBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]
    graph_capture_support: ClassVar[str] = "full_decode_only"

    @staticmethod
    def get_name() -> str:
        return "ASCEND_MLA"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_impl_cls() -> type["AscendMLAImpl"]:
        return AscendMLAImpl

    @staticmethod
    def get_builder_cls() -> type["AscendMLAMetadataBuilder"]:
        return AscendMLAMetadataBuilder


class AscendMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's MLA metadata, with the full-graph support the Ascend MLA decode really has (per device)."""

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        from ascend_kernel_plugins.attention.ascend.graph_support import full_graph_support

        return full_graph_support(AttentionCGSupport.NEVER)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> MLACommonMetadata:
        """The capture batch's metadata, whatever its query length.

        vLLM's MLA builder admits only single-token decode batches here, the
        GPU kernels' limit. This backend decodes one token per request and
        sends longer uniform queries (speculative decoding's verification)
        down its prefill path, as it does outside graphs; on a CPU the
        captured artifact runs attention at every replay, so that is safe.
        """
        return self.build(0, common_attn_metadata)


class AscendMLAImpl(MLACommonImpl[MLACommonMetadata]):
    can_return_lse_for_decode: bool = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 **mla_args: Any) -> None:
        # MLACommonImpl.__init__ picks a GPU prefill kernel; the attributes the
        # scaffolding reads are set here instead.
        if kv_sharing_target_layer_name is not None or attn_type != AttentionType.DECODER:
            raise NotImplementedError("the Ascend MLA backend serves decoder self-attention without KV sharing")
        if any(x is not None for x in (alibi_slopes, sliding_window, logits_soft_cap)):
            raise NotImplementedError("the Ascend MLA backend has no alibi / sliding window / soft-cap")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "qk_head_dim",
                     "v_head_dim", "kv_b_proj"):
            setattr(self, name, mla_args[name])
        self.indexer = mla_args.get("indexer")
        self.q_pad_num_heads = mla_args.get("q_pad_num_heads")
        self.supports_quant_query_input = False
        self._use_flashinfer_concat_mla_k = False
        self._pad_v = False
        self.dcp_world_size = 1
        self.cp_kv_cache_interleave_size = 1
        kernel = kernel_mod.current()
        self.ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: MLACommonMetadata,
                    layer: Any) -> tuple[torch.Tensor, None]:
        decode = attn_metadata.decode
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        if q.shape[0] != decode.block_table.shape[0]:
            raise NotImplementedError(
                f"the Ascend MLA decode takes one query token per request ({q.shape[0]} tokens for "
                f"{decode.block_table.shape[0]} requests); multi-token decode is not implemented"
            )
        cache = kv_c_and_k_pe_cache.unsqueeze(2)  # [blocks, block_size, 1, rank + rope]
        out = self.ops.paged_attention_mla(q, cache, decode.block_table.to(torch.int32),
                                           decode.seq_lens.to(torch.int32), self.scale, q.shape[1],
                                           self.kv_lora_rank)
        return out, None

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        if kv_cache.numel() == 0:
            return
        rank = kv_c_normed.shape[-1]
        cache = kv_cache.unsqueeze(2)  # [blocks, block_size, 1, rank + rope]
        nope_cache, rope_cache = cache[..., :rank], cache[..., rank:]
        n = slot_mapping.shape[0]
        self.ops.reshape_and_cache(kv_c_normed[:n].unsqueeze(1), k_pe[:n].reshape(n, 1, -1),
                                   nope_cache, rope_cache, slot_mapping.flatten())


class AscendMLAPrefillBackend(MLAPrefillBackend):
    """MLA prefill (non-absorbed MHA over the new tokens) on the ops seam's flash attention.

    Ascend's flash-attention kernel takes one head size for q, k and v, so v
    is zero-padded to the q/k head size and the output sliced back, as the
    Ascend MLA prefill does. Over a cached prefix (speculative verification,
    chunked prefill) vLLM merges per-chunk results by their log-sum-exp, which
    ``ragged_attention_lse`` returns.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_MLA_PREFILL"

    def __init__(self, num_heads: int, scale: float, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, vllm_config: Any) -> None:
        super().__init__(num_heads, scale, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                         vllm_config)
        kernel = kernel_mod.current()
        self.ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)
        self.masks = kernel.resolve(vllm_config).attention_mask

    def run_prefill_new_tokens(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_softmax_lse: bool,
                               out: torch.Tensor | None = None,
                               output_scale: torch.Tensor | None = None) -> Any:
        if output_scale is not None:
            raise NotImplementedError("the Ascend MLA prefill does not fuse output quantization yet")
        if return_softmax_lse:  # to be merged with cached-prefix chunks (spec verify, chunked prefill)
            starts = self._prefill_metadata.query_start_loc.to("cpu")
            return self.ops.ragged_attention_lse(q, k, v, starts, starts, float(self.scale), causal=True)
        starts = self._prefill_metadata.query_start_loc.to("cpu")
        lens = starts[1:] - starts[:-1]
        v_dim = v.shape[-1]
        v_padded = torch.nn.functional.pad(v, (0, q.shape[-1] - v_dim)) if v_dim < q.shape[-1] else v
        mask = self.masks.causal(int(lens.max()), q.dtype, q.device)
        result = self.ops.flash_attention(q, k, v_padded, mask, lens, float(self.scale), q.shape[1], k.shape[1])
        result = result[..., :v_dim]
        if out is not None:
            out.copy_(result)
            return out
        return result

    def run_prefill_context_chunk(self, chunk: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens over one chunk of their cached prefix (no mask: the prefix precedes them)."""
        if out is not None:
            raise NotImplementedError("the Ascend MLA context prefill returns a fresh tensor")
        return self.ops.ragged_attention_lse(q, k, v, chunk.query_start_loc.to("cpu"), chunk.cu_seq_lens.to("cpu"),
                                             float(self.scale), causal=False)

"""The Ascend MLA backend (decode and cache writes over the ops seam).

Built on vLLM's MLA scaffolding (``MLACommonBackend``/``MLACommonImpl``):
vLLM's ``MLAAttention`` layer orchestrates weight-absorbed decode (MQA) and
non-absorbed prefill (MHA). This backend supplies

* the cache write: the latent ``kv_c`` and rotary key ``k_pe`` go to the
  layer's nope and rope caches (the MLA layout's split of one page) with the
  same ``reshape_and_cache`` kernel as standard attention;
* the decode: ``paged_attention_mla`` over the latent cache, with the step's
  host lengths, which the builder adds to vLLM's decode metadata
  (``decode.host_seq_lens``: one host buffer rewritten each step, padded
  requests at length 1, as the standard builder keeps them,
  :mod:`.host_lengths`). Inside an ACL FULL capture (FULL_DECODE_ONLY on an
  NPU) the decode is issued into a captured buffer as one updatable task group
  per layer (:func:`.graph_params.captured_mla_decode`), re-issued with each
  step's host lengths before a replay.

* the prefill (:class:`AscendMLAPrefillBackend`): causal flash attention over
  the new tokens, chosen through the platform's MLA-prefill seam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, MultipleOf
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.upstream import mla_impl_defaults
from ascend_kernel_plugins.attention.ascend.backend import host_seq_lens_are_exact
from ascend_kernel_plugins.attention.ascend.graph_params import captured_mla_decode
from ascend_kernel_plugins.attention.ascend.host_lengths import StepHostLengths, host_lengths_capacity
from ascend_kernel_plugins.graph import active_full_capture


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


@dataclass
class AscendMLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's MLA decode metadata plus the host lengths Ascend's MLA kernel takes.

    ``host_seq_lens`` is int32 on the host, one per decode request, padded
    requests at length 1; for the step's own batch it is a view of the
    builder's one buffer (what a captured task was issued from).
    """

    host_seq_lens: torch.Tensor | None = None


class AscendMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's MLA metadata with the decode's host lengths, and the full-graph support the Ascend MLA decode has."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device,
                 **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, **kwargs)
        self.host_seq_lens_exact = host_seq_lens_are_exact(vllm_config)
        #: the step's decode lengths, rewritten in place each step (what captured MLA decode tasks were issued from)
        self.host_lengths = StepHostLengths(host_lengths_capacity(vllm_config))

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        from ascend_kernel_plugins.attention.ascend.graph_support import full_graph_support

        return full_graph_support(AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> MLACommonMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        return self._with_host_lengths(metadata, common_attn_metadata, drafting=False)

    def build_for_drafting(self, common_attn_metadata: Any, draft_index: int) -> MLACommonMetadata:
        """A drafter's pass: its lengths are its own, so they stay out of the step's buffer."""
        metadata = super().build(0, common_attn_metadata, fast_build=True)
        return self._with_host_lengths(metadata, common_attn_metadata, drafting=True)

    def _with_host_lengths(self, metadata: MLACommonMetadata, m: Any, drafting: bool) -> MLACommonMetadata:
        """Give the decode metadata its host lengths (decode requests come first in vLLM's MLA batches).

        From the runner's host copy when that is exact (see
        :func:`~.backend.host_seq_lens_are_exact`), else from the device
        tensor (drafters advance it without the host copy; decode context
        parallelism makes it rank-local).
        """
        decode = metadata.decode
        if decode is None:
            return metadata
        n = metadata.num_decodes
        host = m.seq_lens_cpu_upper_bound
        if self.host_seq_lens_exact and host is not None and not drafting and self.dcp_world_size == 1:
            lengths = host[:n].to(torch.int32)
        else:
            lengths = decode.seq_lens.to("cpu", torch.int32)
        lengths = lengths.clamp(min=1) if drafting else self.host_lengths.write(lengths)
        metadata.decode = AscendMLADecodeMetadata(decode.block_table, decode.seq_lens, decode.dcp_tot_seq_lens,
                                                  host_seq_lens=lengths)
        return metadata

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> MLACommonMetadata:
        """The capture batch's metadata, whatever its query length.

        vLLM's MLA builder admits only single-token decode batches here, the
        GPU kernels' limit. This backend decodes one token per request and
        sends longer uniform queries (speculative decoding's verification)
        down its prefill path, as it does outside graphs; on a CPU the
        captured artifact runs attention at every replay, so that is safe.
        On an NPU the builder declares single-token decode only, so vLLM
        captures no longer queries (and the captured decode refuses them).
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
        mla_impl_defaults(self)  # MLACommonImpl's private switches, which its skipped __init__ would set
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
        block_table = decode.block_table.to(torch.int32)
        lengths = getattr(decode, "host_seq_lens", None)
        capture = active_full_capture()
        if capture is not None:  # recorded into an ACL FULL graph: a task group updated before each replay
            if lengths is None:
                raise RuntimeError("an ACL FULL capture of MLA decode needs the builder's host lengths "
                                   "(decode.host_seq_lens, set by AscendMLAMetadataBuilder)")
            out = q.new_empty(q.shape[0], q.shape[1], self.kv_lora_rank)
            captured_mla_decode(capture, self.ops, getattr(layer, "layer_name", None), q, cache, block_table,
                                lengths, self.scale, q.shape[1], self.kv_lora_rank, out)
            return out, None
        if lengths is None:  # metadata from vLLM's own builder
            lengths = decode.seq_lens.to("cpu", torch.int32)
        out = self.ops.paged_attention_mla(q, cache, block_table, lengths, self.scale, q.shape[1],
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
        self._host: _PrefillHostLengths | None = None

    def prepare_metadata(self, prefill_metadata: Any) -> None:
        """vLLM's builder hands over the step's prefill metadata: read its lengths to the host here, once per
        step, not in every layer's prefill (each copy of a device tensor to the host is a sync)."""
        super().prepare_metadata(prefill_metadata)
        self._host = _PrefillHostLengths.of(prefill_metadata)

    def run_prefill_new_tokens(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_softmax_lse: bool,
                               out: torch.Tensor | None = None,
                               output_scale: torch.Tensor | None = None) -> Any:
        if output_scale is not None:
            raise NotImplementedError("the Ascend MLA prefill does not fuse output quantization yet")
        host = self._step_host()
        starts = host.query_start_loc
        if return_softmax_lse:  # to be merged with cached-prefix chunks (spec verify, chunked prefill)
            return self.ops.ragged_attention_lse(q, k, v, starts, starts, float(self.scale), causal=True)
        v_dim = v.shape[-1]
        v_padded = torch.nn.functional.pad(v, (0, q.shape[-1] - v_dim)) if v_dim < q.shape[-1] else v
        mask = self.masks.causal(host.max_query_len, q.dtype, q.device)
        result = self.ops.flash_attention(q, k, v_padded, mask, host.query_lens, float(self.scale), q.shape[1],
                                          k.shape[1])
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
        query_starts, key_starts = self._step_host().chunk(chunk)
        return self.ops.ragged_attention_lse(q, k, v, query_starts, key_starts, float(self.scale), causal=False)

    def _step_host(self) -> "_PrefillHostLengths":
        """This step's host lengths (read by :meth:`prepare_metadata`, which vLLM's builder calls each step)."""
        host = self._host
        if host is None:
            raise RuntimeError("the Ascend MLA prefill ran before vLLM's builder called prepare_metadata")
        return host


@dataclass
class _PrefillHostLengths:
    """One step's prefill lengths on the host: what every layer's prefill passes to the kernels."""

    source: Any  #: the prefill metadata they were read from
    query_start_loc: torch.Tensor
    query_lens: torch.Tensor
    max_query_len: int
    #: per context chunk (by index): its query starts and its cumulative key lengths
    chunks: dict[int, tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of(cls, prefill: Any) -> "_PrefillHostLengths":
        starts = prefill.query_start_loc.to("cpu")
        lens = starts[1:] - starts[:-1]
        context = getattr(prefill, "chunked_context", None)
        chunks = {c.index: (c.query_start_loc.to("cpu"), c.cu_seq_lens.to("cpu"))
                  for c in (context.chunks if context is not None else ())}
        return cls(prefill, starts, lens, int(lens.max()) if lens.numel() else 0, chunks)

    def chunk(self, chunk: Any) -> tuple[torch.Tensor, torch.Tensor]:
        found = self.chunks.get(chunk.index)
        if found is None:  # a chunk the builder did not list: read it now
            found = self.chunks[chunk.index] = (chunk.query_start_loc.to("cpu"), chunk.cu_seq_lens.to("cpu"))
        return found

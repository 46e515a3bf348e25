"""The MLA layout: one latent cache per layer, seen as separate nope and rope caches.

Multi-head latent attention caches, per token, the compressed KV latent
(``kv_lora_rank`` wide, "nope") followed by the decoupled rotary key
(``qk_rope_head_dim`` wide, "rope"). The Ascend MLA kernels take the two as
separate caches; here they are views of the last dimension of one page view,
with both widths read from the model config and checked against the spec.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import page_views, pd_alignment, split_last_dim


def latent_dims(vllm_config: Any) -> tuple[int, int]:
    hf = vllm_config.model_config.hf_text_config
    return int(hf.kv_lora_rank), int(hf.qk_rope_head_dim)


def is_sparse_model(vllm_config: Any) -> bool:
    """DeepSeek-V3.2-style sparse attention (SFA) models carry an indexer top-k."""
    model = vllm_config.model_config
    return model is not None and hasattr(model.hf_text_config, "index_topk")


class MLALayout:
    __slots__ = ("kv_lora_rank", "rope_dim", "alignment_bytes", "resolved_layout")

    def __init__(self, kv_lora_rank: int, rope_dim: int, alignment_bytes: int, resolved_layout: Any) -> None:
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.alignment_bytes = alignment_bytes
        self.resolved_layout = resolved_layout

    @classmethod
    def from_context(cls, ctx: Any) -> "MLALayout":
        rank, rope = latent_dims(ctx.vllm_config)
        return cls(rank, rope, pd_alignment(ctx.vllm_config, ctx.settings),
                   ctx.vllm_config.cache_config.get_resolved_kv_cache_layout())

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        if spec.head_size != self.kv_lora_rank + self.rope_dim:
            raise KVCacheAllocationError(
                f"MLA layers {placement.layers[:3]}: cache head size {spec.head_size} != kv_lora_rank "
                f"{self.kv_lora_rank} + qk_rope_head_dim {self.rope_dim} from the model config"
            )
        return page_views(backing, placement, spec, num_blocks, kernel_block_size, self.resolved_layout)

    def nope_and_rope(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent ("nope", kv_lora_rank wide) and rotary-key ("rope") caches of one layer."""
        return split_last_dim(view, self.kv_lora_rank)


def _supports(ctx: Any) -> str | None:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    if ctx.subject is None or not issubclass(ctx.subject, MLAAttentionSpec):
        return f"handles MLAAttentionSpec only (got {getattr(ctx.subject, '__name__', ctx.subject)})"
    if is_sparse_model(ctx.vllm_config):
        return "sparse-attention (SFA) model: its caches include the indexer's"
    return None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="mla",
            factory=MLALayout.from_context,
            supports=_supports,
            priority=20,
            description="MLA latent cache as nope (kv_lora_rank) + rope (qk_rope_head_dim) views",
        )
    ]

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
from ascend_kernel_plugins.kv_cache.common import PageViewLayout, handles_spec, layout_entry, split_last_dim


def latent_dims(vllm_config: Any) -> tuple[int, int]:
    hf = vllm_config.model_config.hf_text_config
    return int(hf.kv_lora_rank), int(hf.qk_rope_head_dim)


def is_sparse_model(vllm_config: Any) -> bool:
    """DeepSeek-V3.2-style sparse attention (SFA) models carry an indexer top-k."""
    model = getattr(vllm_config, "model_config", None)
    return model is not None and hasattr(model.hf_text_config, "index_topk")


class MLALayout(PageViewLayout):
    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.kv_lora_rank, self.rope_dim = latent_dims(ctx.vllm_config)

    def check_latent(self, placement: Any, spec: Any, kind: str) -> None:
        if spec.head_size != self.kv_lora_rank + self.rope_dim:
            raise KVCacheAllocationError(
                f"{kind} layers {placement.layers[:3]}: cache head size {spec.head_size} != kv_lora_rank "
                f"{self.kv_lora_rank} + qk_rope_head_dim {self.rope_dim} from the model config"
            )

    def check(self, placement: Any, spec: Any) -> None:
        self.check_latent(placement, spec, "MLA")

    def nope_and_rope(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent ("nope", kv_lora_rank wide) and rotary-key ("rope") caches of one layer."""
        return split_last_dim(view, self.kv_lora_rank)


def mla_spec(ctx: Any) -> str | None:
    return handles_spec(ctx, "MLAAttentionSpec")


def _sparse(ctx: Any) -> str | None:
    return "sparse-attention (SFA) model: its caches include the indexer's" if is_sparse_model(ctx.vllm_config) \
        else None


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("mla", MLALayout, 20, "MLA latent cache as nope (kv_lora_rank) + rope (qk_rope_head_dim) views",
                        mla_spec, _sparse)

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

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import handles_spec
from ascend_kernel_plugins.kv_cache.mla import MLALayout, is_sparse_model


class SFALayout(MLALayout):
    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.index_head_dim = int(ctx.vllm_config.model_config.hf_text_config.index_head_dim)

    @staticmethod
    def is_indexer(spec: Any) -> bool:
        from vllm.v1.kv_cache_interface import SparseCacheRole

        return getattr(spec, "cache_role", None) == SparseCacheRole.INDEXER

    def check(self, placement: Any, spec: Any) -> None:
        if not self.is_indexer(spec):
            self.check_latent(placement, spec, "SFA")
        elif spec.head_size != self.index_head_dim:
            raise KVCacheAllocationError(
                f"SFA indexer layers {placement.layers[:3]}: cache head size {spec.head_size} != index_head_dim "
                f"{self.index_head_dim} from the model config"
            )


def _supports(ctx: Any) -> str | None:
    reason = handles_spec(ctx, "MLAAttentionSpec")
    if reason is None and not is_sparse_model(ctx.vllm_config):
        return "not a sparse-attention model (no index_topk in the model config)"
    return reason


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return [
        Implementation(
            family="kv_cache",
            name="sfa",
            factory=SFALayout,
            supports=_supports,
            priority=30,
            description="SFA: MLA nope/rope caches + indexer key cache (index_head_dim from the config)",
        )
    ]

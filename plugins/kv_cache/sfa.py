"""The SFA layout: MLA's nope/rope caches plus the lightning indexer's key cache.

Sparse flash attention (DeepSeek-V3.2 style) keeps, besides the MLA latent
cache, a per-token key of the indexer that picks the top-k tokens to attend
to. vLLM gives that cache its own MLA-shaped spec with the indexer role; its
width comes from the model's ``index_head_dim`` (read from the config, never
assumed to be 128): either that many values per token, or, for vLLM's own
DeepSeek-V3.2 indexer, that many fp8 bytes plus a float32 scale per 128
values (a ``uint8`` spec of ``index_head_dim + index_head_dim / 128 * 4``).
The Ascend SFA backend's indexer keeps keys in the model dtype (what
``npu_lightning_indexer`` reads), the first form.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import layout_entry
from ascend_kernel_plugins.kv_cache.mla import MLALayout, is_sparse_model, mla_spec


#: vLLM's DeepSeek-V3.2 indexer caches keys as fp8 with one float32 scale per 128 values
INDEXER_QUANT_BLOCK = 128


def fp8_indexer_bytes(index_head_dim: int) -> int:
    """Bytes per token of vLLM's fp8 indexer key cache (uint8 spec): fp8 values + float32 block scales."""
    return index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4


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
        elif spec.head_size not in (self.index_head_dim, fp8_indexer_bytes(self.index_head_dim)):
            raise KVCacheAllocationError(
                f"SFA indexer layers {placement.layers[:3]}: cache head size {spec.head_size} is neither "
                f"index_head_dim {self.index_head_dim} from the model config nor vLLM's fp8 key page of "
                f"{fp8_indexer_bytes(self.index_head_dim)} bytes"
            )


def _dense(ctx: Any) -> str | None:
    return None if is_sparse_model(ctx.vllm_config) else "not a sparse-attention model (no index_topk in the model config)"


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("sfa", SFALayout, 30, "SFA: MLA nope/rope caches + indexer key cache (index_head_dim from the "
                        "config)", mla_spec, _dense)

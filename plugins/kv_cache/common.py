"""What every KV layout shares: PD alignment, placement checks, page views, splits."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.registry import Implementation

#: ``(ctx) -> reason | None``: why a layout passes over this engine (None: it serves it)
Reason = Callable[[Any], "str | None"]


def _first_reason(serves: Reason | None, refuses: Reason | None, ctx: Any) -> str | None:
    reason = serves(ctx) if serves is not None else None
    return reason if reason is not None or refuses is None else refuses(ctx)


def layout_entry(name: str, factory: Any, priority: int, description: str, serves: Reason | None = None,
                 refuses: Reason | None = None) -> list[Implementation]:
    """What every layout plugin's ``ascend_kernel_kv_cache_layouts`` returns: one ``kv_cache`` entry.

    ``serves(ctx)`` says why the model's KV specs are not the layout's kind
    (:func:`handles_spec`, :func:`handles_kv_attention`); ``refuses(ctx)``, asked
    only when they are, why the layout still passes over them (another layout of
    the same kind serves this config). A partial of a module-level function, so
    the entry stays picklable.
    """
    return [Implementation(family="kv_cache", name=name, factory=factory, priority=priority, description=description,
                           supports=functools.partial(_first_reason, serves, refuses))]


def pd_alignment(vllm_config: Any, settings: Any) -> int:
    """Prefill/decode disaggregation (llmdatadist) needs every KV tensor 2 MiB-aligned."""
    return settings.kv_transfer_alignment_bytes if vllm_config.kv_transfer_config is not None else 1


def _layers_text(placement: Any) -> str:
    layers = placement.layers
    return ", ".join(layers[:3]) + (f" (+{len(layers) - 3} more)" if len(layers) > 3 else "")


def check_placement(placement: Any, spec: Any, num_blocks: int) -> None:
    """The placement must hold ``num_blocks`` pages of every layer it names, inside its buffer."""
    page = spec.page_size_bytes
    if num_blocks < 1:
        raise KVCacheAllocationError(f"KV cache for layers {_layers_text(placement)}: {num_blocks} blocks")
    last = len(placement.layers) - 1
    end = placement.offset + last * placement.layer_stride + (num_blocks - 1) * placement.block_stride + page
    if end > placement.size:
        raise KVCacheAllocationError(
            f"KV cache for layers {_layers_text(placement)} needs {end} bytes for {num_blocks} blocks of "
            f"{page} bytes, but the config gives {placement.size}"
        )


def page_views(backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
               kernel_block_size: int | None, resolved_layout: Any) -> list[torch.Tensor]:
    """vLLM 0.32's per-layer ``[blocks, heads, states, content]`` views of a placement."""
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    check_placement(placement, spec, num_blocks)
    return create_kv_cache_views(backing, spec, num_blocks, resolved_layout, placement,
                                 kernel_block_size=kernel_block_size)


def split_last_dim(view: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views of one cache: ``[..., :first]`` and ``[..., first:]`` (no copy)."""
    return view[..., :first], view[..., first:]


def split_kv(view: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a full-attention page view ``[blocks, heads, tokens, head_size + head_size_v]``."""
    return split_last_dim(view, head_size)


def handles_spec(ctx: Any, spec_class_name: str) -> str | None:
    """``supports`` helper: None when the subject spec class is (a subclass of) vLLM's ``spec_class_name``."""
    import vllm.v1.kv_cache_interface as kv

    wanted = getattr(kv, spec_class_name)
    if ctx.subject is None or not issubclass(ctx.subject, wanted):
        return f"handles {spec_class_name} only (got {getattr(ctx.subject, '__name__', ctx.subject)})"
    return None


def handles_kv_attention(ctx: Any) -> str | None:
    """``supports`` helper: None for full-attention specs with separate K and V (not MLA's latent)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    reason = handles_spec(ctx, "FullAttentionSpec")
    if reason is None and issubclass(ctx.subject, MLAAttentionSpec):
        return "MLA caches have no separate K and V"
    return reason


class PageViewLayout:
    """Base of the layouts: PD alignment, the resolved vLLM layout, checked page views.

    A subclass adds what its spec kind needs: a ``check(placement, spec)``
    that raises :class:`KVCacheAllocationError` on a mismatch with the model
    config, ``post(view)`` for a device format, and the typed splits its
    attention backend reads (K/V, nope/rope, Mamba states).
    """

    def __init__(self, ctx: Any) -> None:
        self.alignment_bytes = pd_alignment(ctx.vllm_config, ctx.settings)
        self.resolved_layout = ctx.vllm_config.cache_config.get_resolved_kv_cache_layout()

    def alignment(self, vllm_config: Any) -> int:
        return self.alignment_bytes

    def check(self, placement: Any, spec: Any) -> None:
        """Refuse a spec that disagrees with the model config (default: nothing to check)."""

    def post(self, view: torch.Tensor) -> torch.Tensor:
        return view

    def views(self, backing: torch.Tensor, placement: Any, spec: Any, num_blocks: int,
              kernel_block_size: int | None) -> list[torch.Tensor]:
        self.check(placement, spec)
        return [self.post(v) for v in
                page_views(backing, placement, spec, num_blocks, kernel_block_size, self.resolved_layout)]

"""The Mamba layout: all recurrent states of a layer in one page per block.

A Mamba layer's "KV cache" is its conv state and SSM state (shapes and dtypes
from ``MambaSpec``). They are packed one after the other into the layer's
page, so one block id addresses every state of a sequence. :func:`state_views`
gives each state as a strided view ``[blocks, *shape]`` over the pages (the
page stride, not the state size, separates consecutive blocks).
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from ascend_kernel.errors import KVCacheAllocationError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.kv_cache.common import PageViewLayout, handles_spec, layout_entry


def _state_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return prod(shape) * torch.empty((), dtype=dtype).element_size()


def state_views(page_view: torch.Tensor, spec: Any) -> list[torch.Tensor]:
    """Per-state views ``[blocks, *shape]`` of a layer's ``[blocks, 1, 1, page_bytes]`` int8 page view."""
    pages = page_view.squeeze(1).squeeze(1)
    out = []
    offset = 0
    for shape, dtype in zip(spec.shapes, spec.dtypes):
        nbytes = _state_bytes(shape, dtype)
        out.append(pages[:, offset:offset + nbytes].view(dtype).view(-1, *shape))
        offset += nbytes
    return out


class MambaLayout(PageViewLayout):
    def check(self, placement: Any, spec: Any) -> None:
        needed = sum(_state_bytes(s, d) for s, d in zip(spec.shapes, spec.dtypes))
        if needed > spec.page_size_bytes:
            raise KVCacheAllocationError(
                f"Mamba layers {placement.layers[:3]}: states need {needed} bytes per block, "
                f"the page has {spec.page_size_bytes}"
            )

    @staticmethod
    def state_views(page_view: torch.Tensor, spec: Any) -> list[torch.Tensor]:
        return state_views(page_view, spec)


def has_mamba_state(vllm_config: Any) -> bool:
    model = getattr(vllm_config, "model_config", None)
    return bool(model is not None and model.has_inner_state)


def npu_mamba_limits(vllm_config: Any) -> None:
    """What the Ascend Mamba path cannot serve, refused before anything is allocated.

    Its state cache holds one state per sequence (no per-block checkpoints),
    so prefix caching cannot resume from a cached prefix, and a speculative
    verification step would need the states of rejected tokens rolled back.
    """
    from ascend_kernel.errors import SettingsError

    if not has_mamba_state(vllm_config):
        return
    model = vllm_config.model_config.model
    if vllm_config.cache_config.enable_prefix_caching:
        raise SettingsError(
            f"model {model!r} has Mamba state layers: prefix caching is not supported with them on Ascend; "
            "start the engine with enable_prefix_caching=False"
        )
    spec = vllm_config.speculative_config
    if spec is not None:
        raise SettingsError(
            f"model {model!r} has Mamba state layers: speculative decoding ({spec.method}) is not supported "
            "with them on Ascend; remove speculative_config"
        )


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any):
    if device.kind == "npu":
        npu_mamba_limits(vllm_config)
    return None


def _mamba_spec(ctx: Any) -> str | None:
    return handles_spec(ctx, "MambaSpec")


@hookimpl
def ascend_kernel_kv_cache_layouts() -> list[Implementation]:
    return layout_entry("mamba", MambaLayout, 20, "Mamba conv/SSM states packed per block; strided per-state views",
                        _mamba_spec)

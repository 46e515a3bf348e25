"""KV-cache allocation through the layout plugins (generic: no layout knowledge here).

vLLM 0.32's ``KVCacheConfig`` describes one backing allocation shared by all
``KVCacheTensor`` placements (offset, layer stride, block stride). The core
allocates that buffer once through the device seam (aligned as strictly as
the strictest chosen layout asks), then each placement is viewed by the layout
chosen for its spec type. The result is checked: every layer the config names
gets exactly one cache object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ascend_kernel.errors import KVCacheAllocationError


@dataclass(slots=True)
class LayoutUsage:
    layout: str
    spec: str
    layers: list[str] = field(default_factory=list)
    placements: int = 0
    bytes_addressed: int = 0
    block_size: int = 0
    page_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "spec": self.spec, "layers": len(self.layers),
                "placements": self.placements, "bytes": self.bytes_addressed,
                "block_size": self.block_size, "page_bytes": self.page_bytes}


@dataclass(slots=True)
class KVAllocationReport:
    """What was allocated: bytes the config asked for, bytes allocated, slack, per layout."""

    requested_bytes: int = 0
    allocated_bytes: int = 0
    alignment: int = 1
    slack_bytes: int = 0
    backing_data_ptr: int = 0
    layouts: dict[tuple[str, int], LayoutUsage] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested_bytes": self.requested_bytes,
            "allocated_bytes": self.allocated_bytes,
            "alignment": self.alignment,
            "slack_bytes": self.slack_bytes,
            "layouts": [u.as_dict() for u in self.layouts.values()],
        }


def _round_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _is_layer_major(placement: Any, num_blocks: int) -> bool:
    """Each layer's pages contiguous (layer stride spans all blocks), vs blocks of packed layers."""
    return placement.layer_stride >= num_blocks * placement.block_stride


def _extent(placement: Any, num_blocks: int) -> int:
    """Bytes from a placement's offset to the end of its last page."""
    layers = len(placement.layers)
    if _is_layer_major(placement, num_blocks):
        return (layers - 1) * placement.layer_stride + num_blocks * placement.block_stride
    return (num_blocks - 1) * placement.block_stride + layers * placement.layer_stride


def align_placements(placements: list[Any], num_blocks_of: Callable[[Any], int],
                     alignment: int) -> tuple[list[Any], int]:
    """Re-place every KV tensor so that it, and each layer of a layer-major placement, starts aligned.

    The scheduler only relies on block ids, so where a placement sits in the
    backing buffer is the worker's choice. Each placement gets its own region
    (aliased overlays are given separate memory), its start rounded up to
    ``alignment`` and, when each layer's pages are contiguous, its layer stride
    rounded up too. Returns the new placements and the backing size they need;
    the growth is bounded by ``alignment`` per placement and per layer.
    """
    from dataclasses import replace

    cursor = 0
    moved = []
    for placement in placements:
        blocks = num_blocks_of(placement)
        layer_stride = placement.layer_stride
        if _is_layer_major(placement, blocks):
            layer_stride = _round_up(layer_stride, alignment)
        start = _round_up(cursor, alignment)
        moved_placement = replace(placement, offset=start, layer_stride=layer_stride)
        moved.append(moved_placement)
        cursor = start + _extent(moved_placement, blocks)
    size = _round_up(cursor, alignment)
    return [replace(p, size=size) for p in moved], size


def spec_of_layer(kv_cache_config: Any, layer_name: str) -> tuple[int, Any]:
    """(group id, the layer's own spec) — unwrapping per-layer uniform-type groups."""
    for group_id, group in enumerate(kv_cache_config.kv_cache_groups):
        if layer_name in group.layer_names:
            spec = group.kv_cache_spec
            per_layer = getattr(spec, "kv_cache_specs", None)
            return group_id, (per_layer[layer_name] if per_layer is not None else spec)
    raise KVCacheAllocationError(f"layer '{layer_name}' has a KV cache tensor but belongs to no KV cache group")


def allocate_kv_caches(
    kv_cache_config: Any,
    *,
    layout_for: Callable[[type], tuple[str, Any]],
    vllm_config: Any,
    device: Any,
    torch_device: torch.device,
    kernel_block_sizes: list[int] | None,
    runner_only_layers: set[str],
    borrowed_layers: set[str] = frozenset(),
) -> tuple[dict[str, torch.Tensor], KVAllocationReport]:
    """Allocate the backing buffer and view it per layer through the chosen layouts.

    ``layout_for(spec_type)`` returns the (name, layout) chosen for a spec class.
    """
    report = KVAllocationReport()
    placements = list(kv_cache_config.kv_cache_tensors)
    if not placements:
        return {}, report
    sizes = {p.size for p in placements}
    if len(sizes) != 1:
        raise KVCacheAllocationError(
            f"KV cache tensors must share one backing allocation, but the config gives sizes {sorted(sizes)}"
        )
    size = sizes.pop()
    resolved = []
    for placement in placements:
        if not placement.layers:
            raise KVCacheAllocationError(f"a KV cache tensor of {placement.size} bytes names no layer")
        group_id, spec = spec_of_layer(kv_cache_config, placement.layers[0])
        name, layout = layout_for(type(spec))
        resolved.append((placement, group_id, spec, name, layout))
    alignment = max(layout.alignment(vllm_config) for *_, layout in resolved)
    requested = size
    if alignment > 1:
        aligned, size = align_placements([r[0] for r in resolved], kv_cache_config.num_blocks_of, alignment)
        resolved = [(p, *rest) for p, (_, *rest) in zip(aligned, resolved)]
    backing, base_slack = device.zeros_bytes(size, torch_device, alignment)
    report.requested_bytes = requested
    report.allocated_bytes = size + base_slack
    report.alignment = alignment
    report.slack_bytes = report.allocated_bytes - requested
    report.backing_data_ptr = backing.data_ptr()

    caches: dict[str, torch.Tensor] = {}
    for placement, group_id, spec, layout_name, layout in resolved:
        kernel_block_size = None
        if kernel_block_sizes is not None and group_id < len(kernel_block_sizes):
            kernel_block_size = kernel_block_sizes[group_id]
        views = layout.views(backing, placement, spec, kv_cache_config.num_blocks_of(placement), kernel_block_size)
        if len(views) != len(placement.layers):
            raise KVCacheAllocationError(
                f"layout '{layout_name}' returned {len(views)} caches for "
                f"{len(placement.layers)} layers ({placement.layers})"
            )
        # one row per page format: a spec type can come in several page sizes (SFA's latent and indexer caches)
        usage = report.layouts.setdefault(
            (type(spec).__name__, spec.page_size_bytes),
            LayoutUsage(layout_name, type(spec).__name__, block_size=spec.block_size, page_bytes=spec.page_size_bytes),
        )
        usage.placements += 1
        usage.bytes_addressed += spec.page_size_bytes * kv_cache_config.num_blocks_of(placement) * len(placement.layers)
        for layer, view in zip(placement.layers, views):
            if layer in caches:
                raise KVCacheAllocationError(f"layer '{layer}' is given two KV cache tensors")
            caches[layer] = view
            usage.layers.append(layer)

    expected = {
        name
        for group in kv_cache_config.kv_cache_groups
        for name in group.layer_names
        if name not in runner_only_layers and name not in borrowed_layers
    }
    missing = sorted(expected - set(caches))
    if missing:
        raise KVCacheAllocationError(f"layers with no KV cache tensor in the config: {missing}")
    return caches, report

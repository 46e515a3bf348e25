"""Out-of-tree replacements of vLLM's ``RMSNorm`` and ``RotaryEmbedding`` over the ops seam.

vLLM instantiates a ``CustomOp`` through ``op_registry_oot`` when a class of
the same name is registered there, so every ``RMSNorm(...)`` and plain
``RotaryEmbedding(...)`` a model builds becomes one of these. Variants the
Ascend kernels do not cover fall back to vLLM's own PyTorch path inside the
same layer: a norm over part of the hidden size or without weight, a
rotary embedding with no key (cross-layer KV sharing) or a partial rotary
dimension (``_npu_rotary_embedding`` rotates whole heads). Subclasses of
``RotaryEmbedding`` (scaling variants, MLA's DeepSeek rope) keep their own
class name and are not replaced.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.oot_ops import register_oot
from ascend_kernel.upstream import rotary_cache_for
from ascend_kernel_plugins.layers.sequence_parallel import tp_add_rms_norm

_built: Counter[str] = Counter()


def _ops() -> Any:
    kernel = kernel_mod.current()
    return get_ops(kernel.settings.ops_provider, kernel.device_info.kind)


class AscendRMSNorm(RMSNorm):
    #: set by :func:`.sequence_parallel.mark` on the decoder layers' norms and the final norm
    sp_shards = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seam_ops = _ops()
        self.on_seam = self.has_weight and self.variance_size_override is None
        _built["RMSNorm"] += 1

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.sp_shards and residual is not None:  # x: a marked row-parallel layer's partial sums
            return tp_add_rms_norm(self, x, residual)  # all-reduce or sequence parallel, chosen per call
        if not self.on_seam:
            return self.forward_native(x, residual)
        if residual is None:
            return self.seam_ops.rms_norm(x, self.weight.data, self.variance_epsilon)[0]
        return self.seam_ops.add_rms_norm(x, residual, self.weight.data, self.variance_epsilon)

    forward_cpu = forward_oot


class AscendRotaryEmbedding(RotaryEmbedding):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seam_ops = _ops()
        _built["RotaryEmbedding"] += 1

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        if key is None or self.rotary_dim != self.head_size:
            return self.forward_native(positions, query, key)
        cos_sin_cache = rotary_cache_for(self, query)
        if torch.compiler.is_compiling():
            # traced: the functional op (one registered node a fusion pass can match; it rotates copies)
            return self.seam_ops.rope(positions.flatten(), query, key, self.head_size, cos_sin_cache,
                                      self.is_neox_style)
        # eager: in place, as the device kernel works, with no copy of q and k per layer and step
        self.seam_ops.rotary_embedding(positions.flatten(), query, key, self.head_size, cos_sin_cache,
                                       self.is_neox_style)
        return query, key

    forward_cpu = forward_oot


REPLACEMENTS: dict[str, type[CustomOp]] = {"RMSNorm": AscendRMSNorm, "RotaryEmbedding": AscendRotaryEmbedding}


def register() -> list[str]:
    """Register every replacement once per process; a different class already there is an error."""
    for name, cls in REPLACEMENTS.items():
        register_oot(name, cls, "set ASCEND_KERNEL_LAYER_OPS=vllm-native")
    return sorted(REPLACEMENTS)


def built_counts() -> dict[str, int]:
    """How many layers of each replaced class this process built (the model uses them)."""
    return dict(_built)

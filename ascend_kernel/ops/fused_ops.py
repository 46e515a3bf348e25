"""The norm / rotary seam ops and the fused ops the fusion passes put in their place: contracts, schemas, fakes.

Why registered ops: a fusion pass is a pattern over the traced graph, and a
pattern can only name what the graph holds. The norm and rotary layers'
seam calls are registered torch ops (one opaque node each, on every
provider), and each fused op below is exactly the composition of the ops it
replaces, so a pass changes how many kernels run, never what they compute
(``tests/ops/test_fused_ops.py`` checks each reference against the
composition of the unfused references in float64).

Contracts (Ascend's: the torch_npu calls are in :mod:`.fused_npu`):

* ``rms_norm(x, weight, eps) -> (y, rstd)``: ``y = x * rsqrt(mean(x^2) + eps) * weight``
  (float32 maths, cast to ``x``'s dtype); ``rstd`` float32 ``[..., 1]`` (``npu_rms_norm``).
* ``add_rms_norm(x, residual, weight, eps) -> (y, x + residual)``: the norm of the sum (``npu_add_rms_norm``).
* ``rope(positions, query, key, head_size, cos_sin_cache, is_neox_style) -> (query', key')``:
  the rotary embedding of whole heads, on new tensors (``_npu_rotary_embedding`` on copies).
* ``add_rms_norm_quant(x, residual, weight, eps, inv_scale, offset, bias?) -> (int8, x + residual)``:
  ``quantize(add_rms_norm(...)[0] [+ bias], inv_scale, offset)`` (W8A8 static; ``npu_add_rms_norm_quant``).
* ``add_rms_norm_dynamic_quant(x, residual, weight, eps, bias?) -> (int8, scale [M], x + residual)``:
  ``dynamic_quant(add_rms_norm(...)[0] [+ bias])`` (W8A8_DYNAMIC; ``npu_add_rms_norm_dynamic_quant``).
* ``qk_norm_rope(positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox_style)
  -> (query', key')``: per-head ``rms_norm`` of ``query`` and ``key`` ([T, heads * head_size]) then ``rope``
  (Qwen3's q/k norms; vllm-ascend's split-qkv-rmsnorm-rope kernel).
* ``muls_add(x, y, scale) -> x * scale + y`` (DeepSeek's routed scaling).
"""

from __future__ import annotations

import torch

RMS_NORM_SCHEMA = "Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)"
ADD_RMS_NORM_SCHEMA = "Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)"
ROPE_SCHEMA = ("Tensor positions, Tensor query, Tensor key, int head_size, Tensor cos_sin_cache, "
               "bool is_neox_style) -> (Tensor, Tensor)")
ADD_RMS_NORM_QUANT_SCHEMA = ("Tensor x, Tensor residual, Tensor weight, float eps, Tensor inv_scale, Tensor offset, "
                             "Tensor? bias) -> (Tensor, Tensor)")
ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA = ("Tensor x, Tensor residual, Tensor weight, float eps, Tensor? bias) "
                                     "-> (Tensor, Tensor, Tensor)")
QK_NORM_ROPE_SCHEMA = ("Tensor positions, Tensor query, Tensor key, Tensor q_weight, Tensor k_weight, float eps, "
                       "int head_size, Tensor cos_sin_cache, bool is_neox_style) -> (Tensor, Tensor)")
MULS_ADD_SCHEMA = "Tensor x, Tensor y, float scale) -> Tensor"


def rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def add_rms_norm_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def rope_fake(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
              cos_sin_cache: torch.Tensor, is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key)


def add_rms_norm_quant_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            inv_scale: torch.Tensor, offset: torch.Tensor,
                            bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, dtype=torch.int8), torch.empty_like(x)


def add_rms_norm_dynamic_quant_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                    bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.empty_like(x, dtype=torch.int8), x.new_empty(x.shape[:-1], dtype=torch.float32),
            torch.empty_like(x))


def qk_norm_rope_fake(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor,
                      k_weight: torch.Tensor, eps: float, head_size: int, cos_sin_cache: torch.Tensor,
                      is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key)


def muls_add_fake(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def with_bias(normed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The norm's output plus an optional bias (``beta``), in the norm output's dtype."""
    return normed if bias is None else normed + bias.to(normed.dtype)

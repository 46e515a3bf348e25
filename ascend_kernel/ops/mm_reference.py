"""The reference provider's vision-language ops (contracts: :mod:`.mm_ops`), in plain torch on any device.

Checked in ``tests/ops/test_mm_ops.py`` against their oracles: vLLM's ``MRotaryEmbedding.forward_native``
for mrope, and ``torch.nn.functional.scaled_dot_product_attention`` run sequence by sequence for the
encoder's attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_kernel.ops.mm_ops import (MM_ENCODER_ATTENTION_SCHEMA, MROPE_SCHEMA, count_mrope,
                                      mm_encoder_attention_fake, mrope_fake)
from ascend_kernel.ops.opaque import seam_op


def section_axes(mrope_section: list[int], interleaved: bool, device: torch.device) -> torch.Tensor:
    """For each rotary pair, the position axis (0 time, 1 height, 2 width) its angle comes from."""
    pairs = sum(mrope_section)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3, device=device), torch.tensor(mrope_section, device=device))
    channel = torch.arange(pairs, device=device)
    axes = torch.zeros(pairs, dtype=torch.long, device=device)
    axes[(channel % 3 == 1) & (channel < 3 * mrope_section[1])] = 1
    axes[(channel % 3 == 2) & (channel < 3 * mrope_section[2])] = 2
    return axes


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox_style: bool) -> torch.Tensor:
    """``x`` [T, heads * head_size] with the first ``2 * cos.shape[-1]`` of each head rotated (a new tensor)."""
    view = x.view(x.shape[0], -1, head_size)
    rotary_dim = 2 * cos.shape[-1]
    rot, rest = view[..., :rotary_dim], view[..., rotary_dim:]
    c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    a, b = rot.chunk(2, dim=-1) if is_neox_style else (rot[..., 0::2], rot[..., 1::2])
    ra, rb = a * c - b * s, b * c + a * s
    new = torch.cat((ra, rb), dim=-1) if is_neox_style else torch.stack((ra, rb), dim=-1).flatten(-2)
    return torch.cat((new, rest), dim=-1).reshape(x.shape)


class ReferenceMMOps:
    @seam_op("mrope", MROPE_SCHEMA, mrope_fake)
    def mrope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
              head_size: int, mrope_section: list[int], is_neox_style: bool, interleaved: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
        count_mrope(interleaved)
        cos, sin = cos_sin_cache.to(query.dtype)[positions.long()].chunk(2, dim=-1)
        if positions.ndim == 2:  # [3, T, pairs] -> [T, pairs], each pair from its axis
            axes = section_axes(list(mrope_section), interleaved, positions.device)
            index = axes.view(1, 1, -1).expand(1, cos.shape[1], -1)
            cos, sin = cos.gather(0, index)[0], sin.gather(0, index)[0]
        return rotate(query, cos, sin, head_size, is_neox_style), rotate(key, cos, sin, head_size, is_neox_style)

    @seam_op("mm_encoder_attention", MM_ENCODER_ATTENTION_SCHEMA, mm_encoder_attention_fake)
    def mm_encoder_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             cu_seqlens: torch.Tensor, scale: float) -> torch.Tensor:
        bounds = cu_seqlens.tolist()  # host lengths: the encoder runs eagerly, outside captured graphs
        out = torch.empty_like(query)
        gqa = query.shape[1] != key.shape[1]
        for start, end in zip(bounds[:-1], bounds[1:]):
            q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # [heads, len, D]
            out[start:end] = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa).transpose(0, 1)
        return out

"""The torch_npu provider's vision-language ops (contracts: :mod:`.mm_ops`). Not run in CI (no NPU).

* mrope: ``torch_npu.npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section,
  rotary_mode, cache_mode)`` returns the rotated ``(query, key)``; ``rotary_mode`` is ``"half"``
  (NeoX) or ``"interleave"`` (GPT-J pairs); 1-D positions take ``mrope_section=[0, 0, 0]``;
  ``cache_mode="interleave"`` is Qwen3-VL's interleaved sections, ``"default"`` the blocks.
* encoder attention: ``torch_npu.npu_fused_infer_attention_score`` in the ``TND`` layout, no mask,
  no block table, ``sparse_mode=0`` and unbounded ``pre_tokens``/``next_tokens`` (full attention),
  with ``actual_seq_lengths``/``actual_seq_lengths_kv`` the host list of cumulative sequence ends
  (``cu_seqlens`` without its leading 0). It returns ``(out, softmax_lse)``. As vLLM-Ascend does,
  a head dim strictly between 64 and 128 is zero-padded to 128 (q, k and v) and the output cut back;
  the scale stays the caller's, so the padding changes no score.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_kernel.ops.mm_ops import (MM_ENCODER_ATTENTION_SCHEMA, MROPE_SCHEMA, count_mrope,
                                      mm_encoder_attention_fake, mrope_fake)
from ascend_kernel.ops.opaque import seam_op

#: head dims in (MIN, MAX) are padded to MAX for the fused attention kernel
PAD_MIN_HEAD_DIM = 64
PAD_TO_HEAD_DIM = 128
_UNBOUNDED = 2147483647


def padded_head_dim(head_dim: int) -> int:
    """The head dim the fused attention kernel is called with (vLLM-Ascend's rule)."""
    return PAD_TO_HEAD_DIM if PAD_MIN_HEAD_DIM < head_dim < PAD_TO_HEAD_DIM else head_dim


class TorchNpuMMOps:
    _npu: object

    @seam_op("mrope", MROPE_SCHEMA, mrope_fake)
    def mrope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
              head_size: int, mrope_section: list[int], is_neox_style: bool, interleaved: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
        count_mrope(interleaved)
        section = list(mrope_section) if positions.ndim == 2 else [0, 0, 0]
        return self._npu.npu_mrope(  # type: ignore[attr-defined]
            positions.contiguous(), query.contiguous(), key.contiguous(), cos_sin_cache.to(query.dtype).contiguous(),
            head_size, mrope_section=section, rotary_mode="half" if is_neox_style else "interleave",
            cache_mode="interleave" if interleaved and positions.ndim == 2 else "default")

    @seam_op("mm_encoder_attention", MM_ENCODER_ATTENTION_SCHEMA, mm_encoder_attention_fake)
    def mm_encoder_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             cu_seqlens: torch.Tensor, scale: float) -> torch.Tensor:
        head_dim = query.shape[-1]
        pad = padded_head_dim(head_dim) - head_dim
        q, k, v = (F.pad(t, (0, pad)) if pad else t for t in (query, key, value))
        ends = cu_seqlens.cpu().tolist()[1:]  # the kernel reads host lengths (as vLLM-Ascend passes them)
        out, _ = self._npu.npu_fused_infer_attention_score(  # type: ignore[attr-defined]
            q, k, v, atten_mask=None, block_table=None, input_layout="TND", block_size=128,
            actual_seq_lengths=ends, actual_seq_lengths_kv=ends, num_heads=query.shape[1],
            num_key_value_heads=key.shape[1], scale=scale, sparse_mode=0, pre_tokens=_UNBOUNDED,
            next_tokens=_UNBOUNDED)
        return out[..., :head_dim].contiguous() if pad else out

"""The vision-language ops of the seam (mrope, the vision encoder's attention): contracts, schemas, fakes.

Both providers route these through registered torch ops (:mod:`ascend_kernel.ops.opaque`), so a traced
model sees one opaque call per op whichever provider runs.

* ``mrope(positions, query, key, cos_sin_cache, head_size, mrope_section, is_neox_style, interleaved)
  -> (query', key')``: rotary embedding with multimodal sections, vLLM's ``MRotaryEmbedding``.
  ``positions`` is ``[T]`` (text only: plain rotary) or ``[3, T]`` (time, height, width);
  ``query``/``key`` are ``[T, heads * head_size]``; ``cos_sin_cache`` rows are ``[cos | sin]`` halves of
  ``rotary_dim`` (the first ``rotary_dim`` of each head rotate, the rest pass through). With 3-D
  positions, the rotary pairs take their angle from the time, height or width position: in consecutive
  blocks of ``mrope_section`` pairs, or (``interleaved``, Qwen3-VL) pair ``i`` from axis ``i % 3``
  while that axis has pairs left. Computed in the query's dtype, as vLLM's native path computes it.
* ``mm_encoder_attention(query [T, Hq, D], key [T, Hk, D], value [T, Hk, D], cu_seqlens [n + 1],
  scale) -> [T, Hq, D]``: non-causal attention within each of the ``n`` packed sequences
  (``cu_seqlens`` are their cumulative ends, starting at 0; a vision encoder's images or windows),
  grouped-query when ``Hk < Hq``; vLLM's ``MMEncoderAttention``.
"""

from __future__ import annotations

from collections import Counter

import torch

MROPE_SCHEMA = ("Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, "
                "int[] mrope_section, bool is_neox_style, bool interleaved) -> (Tensor, Tensor)")
MM_ENCODER_ATTENTION_SCHEMA = "Tensor query, Tensor key, Tensor value, Tensor cu_seqlens, float scale) -> Tensor"


#: mrope calls that ran (an eager call, or a compiled graph's call of the registered op), per variant: the
#: report's ``layer_ops.mrope_calls``, how a test sees that a compiled engine ran the seam's mrope and not
#: vLLM's native forward (tracing runs the fake, which counts nothing)
MROPE_CALLS: Counter[str] = Counter()


def count_mrope(interleaved: bool) -> None:
    """One mrope call by a provider's body: ``interleaved`` (Qwen3-VL's sections) or ``plain`` (blocks)."""
    MROPE_CALLS["interleaved" if interleaved else "plain"] += 1


def mrope_fake(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, *args: object
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key)


def mm_encoder_attention_fake(query: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(query)

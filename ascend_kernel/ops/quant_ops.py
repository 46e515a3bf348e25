"""The int8 quantization ops of the seam: their contracts, schemas and fake (shape-only) implementations.

Both providers route these through the same registered torch ops
(:mod:`ascend_kernel.ops.opaque`), so a traced model sees one opaque call per
op whichever provider runs. The contracts are Ascend's (the torch_npu calls in
:mod:`ascend_kernel.ops.quant_npu`); :mod:`ascend_kernel.ops.quant_reference`
implements them in plain torch and ``tests/ops/test_quant_ops.py`` checks that
against a float64 evaluation of the same formulas.

* ``quantize(x, inv_scale, offset) -> int8``: ``clamp(round(x * inv_scale + offset), -128, 127)``
  (``npu_quantize`` in multiply mode, ``div_mode=False``, along the last axis).
  ``inv_scale``/``offset`` hold 1 or ``x.shape[-1]`` values (per tensor or per
  input channel); rounding is half to even.
* ``dynamic_quant(x) -> (int8 [M, K], scale float32 [M])``: per-row symmetric:
  ``scale = max|x_row| / 127``, ``q = round(x / scale)`` (``npu_dynamic_quant``);
  an all-zero row has scale 0 and quantizes to zeros.
* ``quant_matmul(x_q [M, K] int8, w [K, N] int8, scale [N] or [1], pertoken_scale [M]?, bias [N]?, output_dtype)``:
  the integer product ``acc = x_q @ w`` (exact), then

  - ``bias`` int32: ``(acc + bias) * scale [* pertoken_scale]``;
  - ``bias`` float: ``acc * scale [* pertoken_scale] + bias``;

  in float32, cast to ``output_dtype``. An int64 ``scale`` is the packed form
  ``npu_trans_quant_param`` makes (float32 bits in the low 32 bits, of which the
  device keeps the top 19: sign, exponent and 10 mantissa bits).
* ``grouped_quant_matmul(rows int8 [R, K], w [E, K, N], w_scale [E, N], row_scale [R], counts [E], bias [E, N]?,
  output_dtype)``: the experts' quantized matmul: rows in consecutive groups,
  group ``e`` times ``w[e]``, ``(acc * w_scale[e] + bias[e]) * row_scale``;
  rows past the groups give zeros (``npu_grouped_matmul`` with per-channel and
  per-token scales). ``w`` is int8, or for int4 experts whatever the
  provider's :meth:`int4_experts` made of msModelSlim's packed bytes (the
  reference unpacks them to int8 in [-8, 7] and needs no bias; the device
  views them as int32 and passes the checkpoint's ``scale_bias`` as the
  correction its int4 kernel needs, as ``bias``).
"""

from __future__ import annotations

import torch

QUANTIZE_SCHEMA = "Tensor x, Tensor inv_scale, Tensor offset) -> Tensor"
DYNAMIC_QUANT_SCHEMA = "Tensor x) -> (Tensor, Tensor)"
QUANT_MATMUL_SCHEMA = ("Tensor x_q, Tensor weight, Tensor scale, Tensor? pertoken_scale, Tensor? bias, "
                       "ScalarType output_dtype) -> Tensor")
GROUPED_QUANT_MATMUL_SCHEMA = ("Tensor rows, Tensor weight, Tensor weight_scale, Tensor row_scale, Tensor counts, "
                               "Tensor? bias, ScalarType output_dtype) -> Tensor")

#: what the device keeps of a packed float32 scale (``npu_trans_quant_param``): 19 high bits
PACKED_SCALE_MASK = 0xFFFFE000


def quantize_fake(x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.int8)


def dynamic_quant_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, dtype=torch.int8), x.new_empty(x.shape[:-1], dtype=torch.float32)


def quant_matmul_fake(x_q: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      pertoken_scale: torch.Tensor | None, bias: torch.Tensor | None,
                      output_dtype: torch.dtype) -> torch.Tensor:
    return x_q.new_empty((*x_q.shape[:-1], weight.shape[-1]), dtype=output_dtype)


def grouped_quant_matmul_fake(rows: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                              row_scale: torch.Tensor, counts: torch.Tensor, bias: torch.Tensor | None,
                              output_dtype: torch.dtype) -> torch.Tensor:
    return rows.new_empty((rows.shape[0], weight_scale.shape[-1]), dtype=output_dtype)


def unpack_scale(scale: torch.Tensor) -> torch.Tensor:
    """A quant_matmul scale as float32: a packed int64 scale decoded as the device reads it."""
    if scale.dtype != torch.int64:
        return scale.to(torch.float32)
    bits = (scale & PACKED_SCALE_MASK).to(torch.int32)
    return bits.view(torch.float32)


def float32_bits_to_scale(stored: torch.Tensor) -> torch.Tensor:
    """msModelSlim's ``deq_scale`` as float32: an int64 tensor holds float32 bit patterns (float32 sources)."""
    if stored.dtype == torch.int64:
        return (stored & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    return stored.to(torch.float32)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """msModelSlim's packed W4A8 weight ``[..., N/2, K]`` int8 as its int4 values ``[..., N, K]`` (int8 in [-8, 7]).

    Its saver packs pairs of output rows into one byte: row ``2j`` in the low
    nibble, row ``2j + 1`` in the high one, each a two's-complement int4.
    """
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(packed, 4), 4)  # int8 shifts keep the sign
    high = torch.bitwise_right_shift(packed, 4)
    return torch.stack((low, high), dim=-2).flatten(-3, -2)

"""The quantization schemes of msModelSlim's ``ascend`` format the kernel serves, and what each stores.

Facts of the format (``quant_model_description.json`` names every tensor's
type; the tensors sit beside the weight under the layer's prefix):

* ``W8A8`` (static): int8 ``weight`` [N, K]; per-tensor asymmetric activations
  ``input_scale`` / ``input_offset`` (one value each); ``deq_scale`` [N]
  (input scale x weight scale; float32 bits in an int64 tensor when the source
  model was float32) and ``quant_bias`` int32 [N] (the bias in units of
  ``deq_scale`` minus the zero-point correction ``input_offset * sum_k weight``).
  msModelSlim's v0 API also writes ``weight_scale`` / ``weight_offset`` [N, 1].
* ``W8A8_DYNAMIC``: int8 ``weight`` [N, K], ``weight_scale`` / ``weight_offset``
  [N, 1] (symmetric: the offsets are zero); activations quantized per token at
  run time.
* ``W4A8_DYNAMIC`` (MoE experts only), as the ``ascendv1_saver`` writes it:
  symmetric int4 values per output channel, packed two to a byte along the
  output rows (``weight`` int8 [N/2, K]: row ``2j`` in the low nibble),
  ``weight_scale`` / ``weight_offset`` [N, 1], and ``scale_bias`` (the NPU int4
  kernel's correction, [N, 1], or [N, 16] for down projections: one column per
  tensor-parallel slice of 16); activations quantized per token at run time.
  msModelSlim's per-group form (``weight_scale_second``) is not served.
* ``FLOAT``: kept in the model's float dtype (embeddings, norms, the head...).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT = "FLOAT"
W8A8 = "W8A8"
W8A8_DYNAMIC = "W8A8_DYNAMIC"
W4A8_DYNAMIC = "W4A8_DYNAMIC"

#: schemes a linear layer may have here
LINEAR_SCHEMES = (W8A8, W8A8_DYNAMIC)
#: schemes MoE experts may have here (the kernel's MoE layer runs them)
EXPERT_SCHEMES = (W8A8_DYNAMIC, W4A8_DYNAMIC)
#: every type the kernel reads from a description (others are refused by name)
SERVED_TYPES = (FLOAT, *LINEAR_SCHEMES)


@dataclass(frozen=True, slots=True)
class TensorRule:
    """One tensor a scheme stores beside ``weight``: its suffix and the shape it must have."""

    suffix: str
    shape: str  # "N", "N1" ([N] or [N, 1]), "N*" ([N, anything]), "1" (one value)
    required: bool = True

    def fits(self, shape: tuple[int, ...], out_features: int) -> bool:
        if self.shape == "1":
            return len(shape) <= 1 and (shape[0] if shape else 1) == 1
        if self.shape == "N":
            return tuple(shape) == (out_features,)
        if self.shape == "N*":
            return len(shape) == 2 and shape[0] == out_features
        return tuple(shape) in ((out_features,), (out_features, 1))

    @property
    def shape_text(self) -> str:
        return {"1": "[1] (one value)", "N": "[N]", "N1": "[N, 1] or [N]", "N*": "[N, columns]"}[self.shape]


#: per scheme, the tensors stored beside the int8 ``weight`` [N, K]
TENSORS: dict[str, tuple[TensorRule, ...]] = {
    W8A8: (TensorRule("input_scale", "1"), TensorRule("input_offset", "1"), TensorRule("deq_scale", "N"),
           TensorRule("quant_bias", "N"), TensorRule("weight_scale", "N1", required=False),
           TensorRule("weight_offset", "N1", required=False)),
    W8A8_DYNAMIC: (TensorRule("weight_scale", "N1"), TensorRule("weight_offset", "N1", required=False)),
    W4A8_DYNAMIC: (TensorRule("weight_scale", "N1"), TensorRule("weight_offset", "N1", required=False),
                   TensorRule("scale_bias", "N*", required=False)),
}

#: int4 values per stored int8 along the output rows, per scheme (1 where not packed)
ROWS_PER_BYTE = {W4A8_DYNAMIC: 2}

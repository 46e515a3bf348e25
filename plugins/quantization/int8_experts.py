"""W8A8_DYNAMIC MoE experts: int8 weights with per-channel scales, per-token int8 activations.

The kernel's MoE layer (:mod:`ascend_kernel_plugins.moe_comm.layer`) does the
routing and hands each batch to the comm method the policy chose; only the
expert MLP differs for int8 experts. :class:`Int8LocalExperts` computes it
with the seam's ops, as the device does::

    dynamic_quant(rows) -> grouped_quant_matmul(w13) -> swiglu -> dynamic_quant -> grouped_quant_matmul(w2)

so every comm method (all-gather, all-to-all, MC2, naive multicast) runs int8
experts unchanged. The checkpoint stores per expert ``gate_proj``/``up_proj``/
``down_proj`` ``weight`` (int8 [N, K]), ``weight_scale`` and ``weight_offset``
([N, 1]); vLLM's expert loader places them as ``w13_*``/``w2_*`` of the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from ascend_kernel_plugins.quantization.description import QuantizationError
from ascend_kernel_plugins.moe_comm.experts import LocalExperts
from ascend_kernel_plugins.moe_comm.layer import AscendUnquantizedFusedMoEMethod, unserved_reason


@dataclass(frozen=True, slots=True)
class Int8LocalExperts(LocalExperts):
    """This rank's int8 experts: ``w13`` [local, H, 2I] and ``w2`` [local, I, H] int8, scales per output channel."""

    w13_scale: torch.Tensor | None = None  # [local, 2I] float32
    w2_scale: torch.Tensor | None = None  # [local, H] float32

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        counts = counts[: self.local_experts].to(torch.int64)
        q, scale = self.ops.dynamic_quant(rows)
        hidden = self.ops.grouped_quant_matmul(q, self.w13, self.w13_scale, scale, counts, rows.dtype)
        q, scale = self.ops.dynamic_quant(self.ops.swiglu(hidden))
        return self.ops.grouped_quant_matmul(q, self.w2, self.w2_scale, scale, counts, rows.dtype)


class AscendInt8FusedMoEMethod(AscendUnquantizedFusedMoEMethod):
    """The kernel's MoE layer with W8A8_DYNAMIC experts."""

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        inter = intermediate_size_per_partition
        shapes = {"w13_weight": (num_experts, 2 * inter, hidden_size), "w2_weight": (num_experts, hidden_size, inter)}
        for name, shape in shapes.items():
            param = torch.nn.Parameter(torch.empty(shape, dtype=torch.int8), requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, extra_weight_attrs)
        per_channel = {**extra_weight_attrs, "quant_method": FusedMoeWeightScaleSupported.CHANNEL.value}
        for stem, rows in (("w13", 2 * inter), ("w2", hidden_size)):
            for suffix, init in (("weight_scale", torch.ones), ("weight_offset", torch.zeros)):
                param = torch.nn.Parameter(init(num_experts, rows, 1, dtype=torch.float32), requires_grad=False)
                layer.register_parameter(f"{stem}_{suffix}", param)
                set_weight_attrs(param, per_channel)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        reason = unserved_reason(layer, self.moe)
        if reason is not None:
            raise QuantizationError(f"MoE layer {layer.layer_name}: int8 experts run on the kernel's MoE layer only, "
                                    f"which does not serve {reason}")
        for stem in ("w13", "w2"):
            if bool(getattr(layer, f"{stem}_weight_offset").ne(0).any()):
                raise QuantizationError(f"MoE layer {layer.layer_name} has non-zero {stem} weight offsets: asymmetric "
                                        "int8 experts are not served")
        super().process_weights_after_loading(layer)

    def build_local_experts(self, layer: Any, slot_of: torch.Tensor, local: int) -> LocalExperts:
        experts = Int8LocalExperts(
            w13=layer.w13_weight.data.transpose(1, 2).contiguous(), w2=layer.w2_weight.data.transpose(1, 2).contiguous(),
            slot_of=slot_of, local_experts=local, ops=self.seam_ops,
            w13_scale=layer.w13_weight_scale.data.squeeze(-1).contiguous(),
            w2_scale=layer.w2_weight_scale.data.squeeze(-1).contiguous())
        layer.w13_weight.data, layer.w2_weight.data = experts.w13, experts.w2
        for name in ("w13_weight_scale", "w2_weight_scale", "w13_weight_offset", "w2_weight_offset"):
            setattr(layer, name, None)
        return experts

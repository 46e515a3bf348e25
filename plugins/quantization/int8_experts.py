"""Quantized MoE experts: W8A8_DYNAMIC (int8) and W4A8_DYNAMIC (int4) weights, per-token int8 activations.

The kernel's MoE layer (:mod:`ascend_kernel_plugins.moe_comm.layer`) does the
routing and hands each batch to the comm method the policy chose; only the
expert MLP differs for int8 experts. :class:`Int8LocalExperts` computes it
with the seam's ops, as the device does::

    dynamic_quant(rows) -> grouped_quant_matmul(w13) -> swiglu -> dynamic_quant -> grouped_quant_matmul(w2)

so every comm method (all-gather, all-to-all, MC2, naive multicast) runs int8
experts unchanged. The checkpoint stores per expert ``gate_proj``/``up_proj``/
``down_proj`` ``weight`` (int8 [N, K]), ``weight_scale`` and ``weight_offset``
([N, 1]); vLLM's expert loader places them as ``w13_*``/``w2_*`` of the layer.
W4A8_DYNAMIC experts store the int4 values packed two to a byte along the
output rows (so the loader's row shards stay whole pairs) and a
``scale_bias``; the provider's ``int4_experts`` turns them into its operands
once at load: the reference unpacks them to int8 values (exact int4 products,
no correction needed); the NPU provider keeps the packed bytes, views them
as int32 in FRACTAL_NZ and passes ``scale_bias`` as the int4 kernel's
correction bias, as vllm-ascend's W4A8_DYNAMIC MoE method does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from ascend_kernel.ops.moe_experts import LocalExperts
from ascend_kernel_plugins.moe_comm import AscendUnquantizedFusedMoEMethod, unserved_reason
from ascend_kernel_plugins.quantization.description import QuantizationError
from ascend_kernel_plugins.quantization.int8_linear import ACL_FORMAT_FRACTAL_NZ


@dataclass(frozen=True, slots=True)
class Int8LocalExperts(LocalExperts):
    """This rank's int8 experts: ``w13`` [local, H, 2I] and ``w2`` [local, I, H] int8, scales per output channel."""

    w13_scale: torch.Tensor | None = None  # [local, 2I] float32
    w2_scale: torch.Tensor | None = None  # [local, H] float32
    #: the device's int4 correction, per expert and output channel (None for int8, and on the reference)
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        counts = counts[: self.local_experts].to(torch.int64)
        q, scale = self.ops.dynamic_quant(rows)
        hidden = self.ops.grouped_quant_matmul(q, self.w13, self.w13_scale, scale, counts, self.w13_bias, rows.dtype)
        q, scale = self.ops.dynamic_quant(self.ops.swiglu(hidden))
        return self.ops.grouped_quant_matmul(q, self.w2, self.w2_scale, scale, counts, self.w2_bias, rows.dtype)


class AscendInt8FusedMoEMethod(AscendUnquantizedFusedMoEMethod):
    """The kernel's MoE layer with W8A8_DYNAMIC experts."""

    #: int4 values per stored int8 along the output rows
    rows_per_byte = 1
    scheme = "W8A8_DYNAMIC"

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        inter, packed = intermediate_size_per_partition, self.rows_per_byte
        for stem, out in (("w13", 2 * inter), ("w2", hidden_size)):
            if out % packed:
                raise QuantizationError(f"MoE layer {getattr(layer, 'layer_name', '?')}: {self.scheme} experts pack "
                                        f"{packed} output rows per byte; {stem} has {out} rows on this rank")
        shapes = {"w13_weight": (num_experts, 2 * inter // packed, hidden_size),
                  "w2_weight": (num_experts, hidden_size // packed, inter)}
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
                                        f"{self.scheme} experts are not served")
        super().process_weights_after_loading(layer)

    def expert_weights(self, layer: Any) -> dict[str, torch.Tensor | None]:
        """The grouped matmuls' operands: weights [local, K, N] int8 (FRACTAL_NZ on an NPU), scales [local, N]."""
        nz = functools.partial(self.seam_ops.format_cast, acl_format=ACL_FORMAT_FRACTAL_NZ)
        return {"w13": nz(layer.w13_weight.data.transpose(1, 2).contiguous()),
                "w2": nz(layer.w2_weight.data.transpose(1, 2).contiguous()),
                "w13_scale": layer.w13_weight_scale.data.squeeze(-1).contiguous(),
                "w2_scale": layer.w2_weight_scale.data.squeeze(-1).contiguous()}

    def build_local_experts(self, layer: Any, slot_of: torch.Tensor, local: int) -> LocalExperts:
        experts = Int8LocalExperts(slot_of=slot_of, local_experts=local, ops=self.seam_ops, **self.expert_weights(layer))
        layer.w13_weight.data, layer.w2_weight.data = experts.w13, experts.w2
        for name in ("w13_weight_scale", "w2_weight_scale", "w13_weight_offset", "w2_weight_offset", "w13_scale_bias",
                     "w2_scale_bias"):
            if hasattr(layer, name):
                setattr(layer, name, None)
        return experts


class AscendInt4FusedMoEMethod(AscendInt8FusedMoEMethod):
    """The kernel's MoE layer with W4A8_DYNAMIC experts (msModelSlim's packed per-channel int4)."""

    rows_per_byte = 2
    scheme = "W4A8_DYNAMIC"

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                               **extra_weight_attrs)
        # vLLM's loader loads these as expert biases: gate/up [N, 1] by row shard, down [H, 16] whole (this rank's
        # column groups are picked in int4_experts); read by the NPU provider, unused by the reference
        for stem, shape in (("w13", (2 * intermediate_size_per_partition, 1)), ("w2", (hidden_size, 16))):
            param = torch.nn.Parameter(torch.zeros(num_experts, *shape, dtype=torch.float32), requires_grad=False)
            layer.register_parameter(f"{stem}_scale_bias", param)
            set_weight_attrs(param, extra_weight_attrs)

    def expert_weights(self, layer: Any) -> dict[str, torch.Tensor | None]:
        operands: dict[str, torch.Tensor | None] = {}
        share = (self.moe.tp_rank, self.moe.tp_size)  # which of down_proj's scale_bias column groups are this rank's
        for stem in ("w13", "w2"):
            weight, scale, bias = self.seam_ops.int4_experts(
                getattr(layer, f"{stem}_weight").data, getattr(layer, f"{stem}_weight_scale").data.squeeze(-1),
                getattr(layer, f"{stem}_scale_bias").data, share)
            operands.update({stem: weight, f"{stem}_scale": scale, f"{stem}_bias": bias})
        return operands

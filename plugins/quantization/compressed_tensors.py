"""compressed-tensors int8 W8A8 checkpoints with their linears on the ops seam.

vLLM's ``CompressedTensorsConfig`` reads the checkpoint's schemes; for int8
W8A8 linears it would pick a GEMM kernel by platform (CUTLASS, oneDNN...),
which on an NPU is none. :class:`SeamCompressedTensorsConfig` keeps vLLM's
parsing and every other scheme, and gives int8 W8A8 linears the kernel's
:class:`~ascend_kernel_plugins.quantization.int8_linear.Int8LinearMethod`
(the seam's quantize/dynamic_quant + quant_matmul on an NPU, vLLM-CPU's int8
GEMMs on a CPU host), and int8 MoE experts (channelwise weights, dynamic
per-token activations: the one int8 MoE scheme vLLM reads) the kernel's int8
MoE layer, so they run every comm method under expert parallelism (vLLM's
own int8 MoE kernels have no NPU backend, and vLLM-CPU's is not
expert-parallel). The chosen implementation installs it on the engine's
config before the model is built (``prepare_model``), so nothing outside
this engine changes.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsW8A8Int8

from ascend_kernel_plugins.quantization import int8_linear as il

FORMAT = "compressed-tensors"


class SeamCompressedTensorsConfig(CompressedTensorsConfig):
    """vLLM's compressed-tensors config, with int8 W8A8 linears on the kernel's int8 linear."""

    seam_ops: Any = None

    @classmethod
    def wrapping(cls, original: CompressedTensorsConfig, ops: Any) -> "SeamCompressedTensorsConfig":
        """This engine's parsed config, as this class (the same state; vLLM's instance is left as it was)."""
        config = cls.__new__(cls)
        config.__dict__.update(original.__dict__)
        config.seam_ops = ops
        config.seam_stats = il.LayerStats()
        return config

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, LinearBase):
            scheme = self.get_scheme(layer=layer, layer_name=prefix)
            if isinstance(scheme, CompressedTensorsW8A8Int8):
                return int8_method(scheme, self.seam_ops, prefix, self.seam_stats)
        if isinstance(layer, RoutedExperts) and self.int8_experts(layer, prefix):
            from ascend_kernel_plugins.quantization.int8_experts import AscendInt8FusedMoEMethod

            self.seam_stats.add_experts("W8A8_DYNAMIC")
            return AscendInt8FusedMoEMethod(layer.moe_config)
        return super().get_quant_method(layer, prefix)

    def int8_experts(self, layer: Any, prefix: str) -> bool:
        """Whether the layer's experts are int8 W8A8 (channelwise symmetric weights, dynamic per-token input).

        The scheme of expert 0's projections, found as vLLM finds it (a
        ``Linear`` target also covers fused experts); vLLM checks that all
        projections agree when it builds a method, and so does this.
        """
        if "Linear" in self.target_scheme_map:
            self.target_scheme_map.setdefault("RoutedExperts", self.target_scheme_map["Linear"])
        names = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name)
        schemes = [self.get_scheme_dict(layer, f"{prefix}.0.{name}") for name in names]
        if schemes[0] is None or any(s != schemes[0] for s in schemes):
            return False
        weights, inputs = schemes[0].get("weights"), schemes[0].get("input_activations")
        return (weights is not None and inputs is not None and _int8(weights) and _int8(inputs)
                and weights.symmetric and str(weights.strategy).lower().endswith("channel") and not weights.dynamic
                and inputs.symmetric and bool(inputs.dynamic) and str(inputs.strategy).lower().endswith("token"))


def _int8(args: Any) -> bool:
    return args.num_bits == 8 and str(args.type).lower().endswith("int")


def int8_method(scheme: CompressedTensorsW8A8Int8, ops: Any, prefix: str,
                stats: il.LayerStats | None = None) -> il.Int8LinearMethod:
    """compressed-tensors' int8 tensors (names and shapes as its checkpoints store them) on the kernel's linear."""
    channelwise = str(scheme.strategy).lower().endswith("channel")
    declared: dict[str, Any] = {"weight_scale": (il.per_channel((1,)) if channelwise else il.per_shard, torch.float32)}
    if scheme.is_static_input_scheme:
        declared["input_scale"] = (il.per_shard, torch.float32)
        if not scheme.input_symmetric:
            declared["input_zero_point"] = (il.per_shard, torch.int8)

    def collect(layer: torch.nn.Module) -> il.Int8Weights:
        scale = layer.weight_scale.data.to(torch.float32)
        if channelwise:
            scale = scale.reshape(-1)
        else:  # one scale per logical shard, spread over its rows
            scale = torch.cat([s.expand(width) for s, width in zip(scale.reshape(-1), layer.logical_widths)])
        static = scheme.is_static_input_scheme
        input_scale = il.one_value(layer, "input_scale") if static else None
        zero = il.one_value(layer, "input_zero_point") if static and not scheme.input_symmetric else None
        return il.Int8Weights(layer.weight.data, scale, input_scale, zero)

    kind = "W8A8" if scheme.is_static_input_scheme else "W8A8_DYNAMIC"
    return il.Int8LinearMethod(declared, collect, ops, scheme=kind, prefix=prefix, stats=stats)


class CompressedTensorsOnSeam:
    """The family's object for compressed-tensors checkpoints: installs the seam config before the model is built."""

    format = FORMAT
    name = "compressed-tensors-seam"

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.config: SeamCompressedTensorsConfig | None = None

    def prepare_model(self, vllm_config: Any) -> list[str]:
        original = vllm_config.quant_config
        if not isinstance(original, CompressedTensorsConfig):
            return []
        self.config = SeamCompressedTensorsConfig.wrapping(original, self.ops)
        vllm_config.quant_config = self.config
        return ["quant_config: compressed-tensors int8 W8A8 linears and experts -> the kernel's seam int8 layers"]

    def describe(self) -> dict[str, Any]:
        stats = il.LayerStats() if self.config is None else self.config.seam_stats
        return {"format": FORMAT, **stats.as_dict()}

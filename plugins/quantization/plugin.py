"""The quantization plugin: quantized checkpoints (msModelSlim's ``ascend`` format, compressed-tensors int8).

Three hooks:

* ``ascend_kernel_pre_register``: vLLM must know the name ``ascend`` before
  it builds a config (``--quantization ascend`` and the config class that
  reads ``quant_model_description.json``);
* ``ascend_kernel_configure``: an msModelSlim checkpoint is detected without
  ``--quantization`` (a recorded config change), and an NPU refuses float32
  activations (its int8 matmul writes bfloat16 or float16);
* ``ascend_kernel_quant_methods``: the family ``quantization``, one entry per
  checkpoint format the kernel runs on the ops seam, plus vLLM's own configs
  as the low-priority fallback for formats the kernel does not own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

logger = logging.getLogger("ascend_kernel")

ASCEND = "ascend"
COMPRESSED_TENSORS = "compressed-tensors"


def checkpoint_format(vllm_config: Any) -> str | None:
    model_config = getattr(vllm_config, "model_config", None)
    return getattr(model_config, "quantization", None)


@hookimpl
def ascend_kernel_pre_register() -> list[str]:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    from ascend_kernel_plugins.quantization.ascend_format import AscendQuantConfig

    if ASCEND in QUANTIZATION_METHODS:
        return []
    register_quantization_config(ASCEND)(AscendQuantConfig)
    return [f"vLLM quantization method '{ASCEND}' (msModelSlim checkpoints)"]


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any) -> list[Any]:
    from ascend_kernel.config_changes import change
    from ascend_kernel_plugins.quantization.description import QuantizationError
    from ascend_kernel_plugins.quantization.description import DESCRIPTION_FILE

    changes = []
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None:
        return changes
    if model_config.quantization is None and (Path(model_config.model) / DESCRIPTION_FILE).is_file():
        from vllm.config import VllmConfig

        changes.append(change(vllm_config, "model_config.quantization", ASCEND,
                              f"the model directory holds msModelSlim's {DESCRIPTION_FILE}"))
        vllm_config.quant_config = VllmConfig.get_quantization_config(model_config, vllm_config.load_config)
    import torch

    if model_config.quantization in (ASCEND, COMPRESSED_TENSORS) and device.kind == "npu" \
            and model_config.dtype == torch.float32:
        raise QuantizationError(
            f"a {model_config.quantization} int8 checkpoint on an NPU needs bfloat16 or float16 activations "
            "(npu_quant_matmul writes those, not float32): pass --dtype bfloat16")
    if model_config.quantization in (ASCEND, COMPRESSED_TENSORS) and model_config.dtype == torch.float32:
        logger.warning("ascend-kernel: %s checkpoint with float32 activations: its int8 layers run on the seam's "
                       "reference ops (slow; vLLM-CPU's int8 kernels take bfloat16/float16: --dtype bfloat16)",
                       model_config.quantization)
    return [c for c in changes if c is not None]


def _serves(fmt: str) -> Any:
    def supports(ctx: Any) -> str | None:
        found = checkpoint_format(ctx.vllm_config)
        if found is None:
            return "the model is not quantized"
        return None if found == fmt else f"the checkpoint's format is {found!r}, not {fmt!r}"
    return supports


def _vllm_supports(ctx: Any) -> str | None:
    found = checkpoint_format(ctx.vllm_config)
    if found is None:
        return "the model is not quantized"
    if found == ASCEND:
        return "vLLM has no kernels for msModelSlim's ascend format"
    return None


def _ascend(ctx: Any) -> Any:
    from ascend_kernel.ops import ops_for
    from ascend_kernel_plugins.quantization.ascend_format import AscendSchemes

    return AscendSchemes(ops_for(ctx))


def _compressed_tensors(ctx: Any) -> Any:
    from ascend_kernel.ops import ops_for
    from ascend_kernel_plugins.quantization.compressed_tensors import CompressedTensorsOnSeam

    return CompressedTensorsOnSeam(ops_for(ctx))


class VllmQuantization:
    """vLLM's own quantization config and kernels, untouched (formats the kernel does not own)."""

    format = None
    name = "vllm"

    def describe(self) -> dict[str, Any]:
        return {"format": "vLLM's own"}


@hookimpl
def ascend_kernel_quant_methods() -> list[Implementation]:
    return [
        Implementation(family="quantization", name="ascend", factory=_ascend, supports=_serves(ASCEND), priority=20,
                       description="msModelSlim checkpoints: W8A8 / W8A8_DYNAMIC linears on the ops seam "
                                   "(vLLM-CPU's int8 GEMMs on a CPU host)"),
        Implementation(family="quantization", name="compressed-tensors-seam", factory=_compressed_tensors,
                       supports=_serves(COMPRESSED_TENSORS), priority=20,
                       description="compressed-tensors int8 W8A8 linears on the ops seam; other schemes stay vLLM's"),
        Implementation(family="quantization", name="vllm", factory=lambda ctx: VllmQuantization(),
                       supports=_vllm_supports, priority=0,
                       description="vLLM's own quantization config and kernels (fallback)"),
    ]

"""The fusion plugin: graph fusion passes over the seam ops (family ``fusion_pass``, a table: each enabled pass runs).

Each pass is one registered implementation, so ``ascend-kernel explain``
shows it built, or why not: forced off by its setting (vllm-ascend's own
``ascend_compilation_config`` keys: ``fuse_norm_quant``, ``fuse_qknorm_rope``,
``fuse_muls_add``), or nothing for it to fuse in this engine (the model's
norms run vLLM's own layers, no routed scaling, a dtype the NPU's fused
kernels do not take), or, for muls-add on a CPU host, slower than what inductor
makes of the unfused graph (it stands down unless ``fuse_muls_add`` is set). The passes run where the platform's pass manager and
the kernel's compiles put them (:mod:`ascend_kernel.ops.pass_manager`).
"""

from __future__ import annotations

from typing import Any, Callable

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.ops import ops_for
from ascend_kernel.ops.opaque import provider_handle
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.fusion.passes import NPU_NORM_DTYPES, MulsAddPass, NormQuantPass, QkNormRopePass
from ascend_kernel_plugins.fusion.settings import FusionSettings


@hookimpl
def ascend_kernel_settings() -> type[FusionSettings]:
    return FusionSettings


#: each pass's switch, read from the engine's settings
SWITCHES: dict[str, Callable[[Any], bool]] = {
    "fuse_norm_quant": lambda settings: settings.fuse_norm_quant,
    "fuse_qknorm_rope": lambda settings: settings.fuse_qknorm_rope,
    "fuse_muls_add": lambda settings: settings.fuse_muls_add,
}


def _forced_off(ctx: Any, setting: str) -> str | None:
    if SWITCHES[setting](ctx.settings):
        return None
    return (f"forced off: {type(ctx.settings).env_name(setting)}=false "
            f"(ascend_compilation_config.{setting} in vllm-ascend's terms)")


def _seam_layers(ctx: Any) -> str | None:
    """Norm and rotary patterns need the seam's layers in the graph (the ``ascend`` layer ops)."""
    if ctx.device.kind == "npu" or ctx.settings.forced("layer_ops") == "ascend":
        return None
    return ("the model's norms and rotary run vLLM's own layers on this host (layer_ops vllm-native), so no "
            "seam norm is in the graph; ASCEND_KERNEL_LAYER_OPS=ascend puts them there")


def _npu_dtype(ctx: Any) -> str | None:
    dtype = getattr(getattr(ctx.vllm_config, "model_config", None), "dtype", None)
    if ctx.device.kind == "npu" and dtype is not None and dtype not in NPU_NORM_DTYPES:
        return f"model dtype {dtype}: the NPU's fused norm kernels take float16/bfloat16"
    return None


def routed_scaling_factor(vllm_config: Any) -> float | None:
    """The model's routed-expert scale, where vLLM multiplies by it (a factor of 1.0 is skipped there)."""
    model_config = getattr(vllm_config, "model_config", None)
    hf = getattr(model_config, "hf_text_config", None) if model_config is not None else None
    scale = getattr(hf, "routed_scaling_factor", None)
    return float(scale) if isinstance(scale, (int, float)) and float(scale) != 1.0 else None


def _muls_add_applies(ctx: Any) -> str | None:
    if routed_scaling_factor(ctx.vllm_config) is None:
        return "the model has no routed_scaling_factor other than 1.0 (vLLM multiplies by none)"
    return None


def _muls_add_on_host(ctx: Any) -> str | None:
    """On a CPU host the pass stands down unless ``fuse_muls_add`` is set explicitly.

    Why (measured, bench/fusion.py on a DeepSeek-V2 with routed_scaling_factor
    2.0, compiled): inductor already merges the plain ``x * scale + y`` into
    the pointwise kernel around it, while ``muls_add`` is one more opaque seam
    call per MoE layer and decode step that inductor cannot fuse. On an NPU the
    fused op is one kernel in place of two, and the pass runs.
    """
    if ctx.device.kind == "npu" or MulsAddPass.setting in ctx.settings.model_fields_set:
        return None
    return (f"stands down on a CPU host: inductor already fuses x * scale + y into its own pointwise kernel, and "
            f"muls_add would add one opaque seam call per MoE layer and step (slower, bench/fusion.py); "
            f"{type(ctx.settings).env_name(MulsAddPass.setting)}=true forces it on")


def _first(*checks: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def supports(ctx: Any) -> str | None:
        return next((why for why in (check(ctx) for check in checks) if why is not None), None)
    return supports


def _muls_add(ctx: Any) -> MulsAddPass:
    return MulsAddPass(ctx.device.kind, routed_scaling_factor(ctx.vllm_config), provider_handle(ops_for(ctx)))


@hookimpl
def ascend_kernel_fusion_passes() -> list[Implementation]:
    def off(setting: str) -> Callable[[Any], str | None]:
        return lambda ctx: _forced_off(ctx, setting)

    return [
        Implementation(family="fusion_pass", name=NormQuantPass.name,
                       factory=lambda ctx: NormQuantPass(ctx.device.kind),
                       supports=_first(off(NormQuantPass.setting), _seam_layers, _npu_dtype), priority=30,
                       description=NormQuantPass.description),
        Implementation(family="fusion_pass", name=QkNormRopePass.name,
                       factory=lambda ctx: QkNormRopePass(ctx.device.kind),
                       supports=_first(off(QkNormRopePass.setting), _seam_layers, _npu_dtype), priority=20,
                       description=QkNormRopePass.description),
        Implementation(family="fusion_pass", name=MulsAddPass.name, factory=_muls_add,
                       supports=_first(off(MulsAddPass.setting), _muls_add_applies, _muls_add_on_host), priority=10,
                       description=MulsAddPass.description),
    ]

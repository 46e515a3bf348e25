"""The settings the fusion plugin reads (declared by its ``ascend_kernel_settings``).

The names are vllm-ascend's own keys of ``additional_config["ascend_compilation_config"]``
(defaults on there too), so a migrated config means the same here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class FusionSettings(BaseModel):
    """Graph fusion passes over the seam ops in every graph the kernel compiles."""

    fuse_norm_quant: bool = Field(
        True, description="Fuse add_rms_norm + quantize (W8A8 static) / dynamic_quant (W8A8_DYNAMIC), with or "
        "without a norm bias, into add_rms_norm_quant / add_rms_norm_dynamic_quant.")
    fuse_qknorm_rope: bool = Field(
        True, description="Fuse the per-head q/k RMSNorms and the rotary embedding (Qwen3) into qk_norm_rope.")
    fuse_muls_add: bool = Field(
        True, description="Fuse x * routed_scaling_factor + y (DeepSeek's routed experts) into muls_add.")

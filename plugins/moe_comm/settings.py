"""The settings the MoE communication plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MoECommSettings(BaseModel):
    """MC2 policy and kernel toggles (typed replacements of the seeds' ``VLLM_ASCEND_*`` variables)."""

    mc2_min_world_size: int = Field(
        16, ge=1, description="On A2, MC2 is used only when the DP x TP world has at least this many ranks."
    )
    enable_fused_mc2: bool = Field(False, description="Use the fused MC2 MoE kernel.")
    enable_mc2_hierarchy_comm: bool = Field(
        False, description="Hierarchical MC2 communication (incompatible with fused MC2)."
    )

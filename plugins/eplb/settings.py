"""The settings the EPLB plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class EplbSettings(BaseModel):
    """Dynamic EPLB on the kernel's platforms, where vLLM's own ``--enable-eplb`` is refused."""

    enable_eplb: bool = Field(
        False, description="Dynamic expert load balancing with vLLM's EplbState (needs enable_expert_parallel). "
        "The kernel CLI's --engine-arg enable_eplb=True lands here: vLLM refuses the flag off CUDA/XPU.")
    eplb_config: dict[str, Any] = Field(
        default_factory=dict, description="vLLM's EPLBConfig fields (window_size, step_interval, "
        "num_redundant_experts, log_balancedness...); policy names an eplb_policy entry (default: vLLM's).")
    eplb_max_swaps: int = Field(
        2, ge=1, description="The swap-limited policy's most expert swaps per layer and rearrangement.")
    eplb_record_path: str = Field(
        "", description="Write the expert map (physical -> logical per layer, JSON) here at start and after "
        "every rearrangement (rank 0).")
    eplb_replay_path: str = Field(
        "", description="Start from the expert map recorded in this file and keep it (no rearrangement).")

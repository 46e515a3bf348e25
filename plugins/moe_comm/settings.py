"""The settings the MoE communication plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ascend_kernel.settings import unimplemented_toggle


class MoECommSettings(BaseModel):
    """MC2 policy and kernel toggles (typed replacements of the seeds' ``VLLM_ASCEND_*`` variables)."""

    mc2_min_world_size: int = Field(
        16, ge=1, description="On A2, MC2 is used only when the DP x TP world has at least this many ranks."
    )
    moe_trace_experts: bool = Field(
        True, description="Under compilation at TP=1 without expert parallelism on a CPU host, let Dynamo trace "
        "the MoE layers' routing and vLLM-CPU's fused expert kernel (as stock vLLM-CPU does) instead of one opaque "
        "routed-experts op; false keeps the opaque op. The report's moe_comm.experts_under_compile says which ran.")
    # the Ascend runner's MC2 kernel toggles: the mc2 method runs the dispatch/combine pair only
    enable_fused_mc2: bool = unimplemented_toggle(
        "the fused MC2 MoE kernel (dispatch, expert MLP and combine in one NPU kernel)",
        "Use the fused MC2 MoE kernel.",
    )
    enable_mc2_hierarchy_comm: bool = unimplemented_toggle(
        "hierarchical MC2 communication", "Hierarchical MC2 communication (incompatible with fused MC2)."
    )

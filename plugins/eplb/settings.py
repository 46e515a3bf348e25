"""The settings the EPLB plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, field_validator


class EplbSettings(BaseModel):
    """Dynamic EPLB on the kernel's platforms, where vLLM's own ``--enable-eplb`` is refused."""

    enable_eplb: bool = Field(
        False, description="Dynamic expert load balancing with vLLM's EplbState (needs enable_expert_parallel). "
        "The kernel CLI's --engine-arg enable_eplb=True lands here: vLLM refuses the flag off CUDA/XPU.")
    # a JSON object as text (a dict given in additional_config is stored as its JSON): a dict-typed setting would
    # have pydantic-settings decode the environment variable itself, before the kernel can name what is wrong
    eplb_config: str = Field(
        "", description="vLLM's EPLBConfig fields as a JSON object (window_size, step_interval, "
        "num_redundant_experts, log_balancedness...); policy names an eplb_policy entry (default: vLLM's).",
        json_schema_extra={"allowed": 'a JSON object of EPLBConfig fields, e.g. {"window_size": 4, "step_interval": 8}'})
    eplb_max_swaps: int = Field(
        2, ge=1, description="The swap-limited policy's most expert swaps per layer and rearrangement.")
    eplb_record_path: str = Field(
        "", description="Write the expert map (physical -> logical per layer, JSON) here at start and after "
        "every rearrangement (rank 0).",
        json_schema_extra={"allowed": "a file path (its folder is created; empty: no recording)"})
    eplb_replay_path: str = Field(
        "", description="Start from the expert map recorded in this file and keep it (no rearrangement).",
        json_schema_extra={"allowed": "the path of a map eplb_record_path wrote for this model (empty: no replay)"})

    @field_validator("eplb_config", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> str:
        """A dict (additional_config, the CLI) or the text of a JSON object; stored as JSON text."""
        if isinstance(value, dict):
            return json.dumps(value, sort_keys=True) if value else ""
        if not isinstance(value, str):
            raise ValueError(f"expected a JSON object of EPLBConfig fields, got {type(value).__name__}")
        if value.strip():
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON ({exc.msg}); expected an object such as {{\"window_size\": 4}}") from None
            if not isinstance(parsed, dict):
                raise ValueError("expected a JSON object of EPLBConfig fields")
        return value

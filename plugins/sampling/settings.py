"""The settings the sampling plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SamplingSettings(BaseModel):
    enable_topk_topp_optimization: bool = Field(
        False, description="Use the Ascend top-k/top-p sampler where a plugin provides it."
    )

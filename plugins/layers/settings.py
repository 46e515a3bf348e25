"""The settings the layers plugin reads (declared by its ``ascend_kernel_settings``).

``lmhead_tensor_parallel_size`` is what vllm-ascend's
``additional_config["finegrained_tp_config"]["lmhead_tensor_parallel_size"]`` (and its legacy top-level
``lmhead_tensor_parallel_size`` / ``lmhead_tp_size``) map onto.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LayersSettings(BaseModel):
    """How the layers plugin builds layers beyond vLLM's defaults."""

    lmhead_tensor_parallel_size: int | None = Field(
        None, ge=1, description="lm-head tensor parallelism under pure data parallelism (vllm-ascend's "
        "finegrained_tp_config.lmhead_tensor_parallel_size): groups of this many consecutive DP ranks share one lm "
        "head, each rank holding 1/N of its vocabulary rows; hidden states are all-gathered over the group and the "
        "logits redistributed with an all-to-all, so each rank samples its own tokens. Unset or 1: off. MoE models, "
        "TP=1, one pipeline stage, N dividing the DP size.")

"""The settings the TP-communication plugin reads (declared by its ``ascend_kernel_settings``).

``sequence_parallel`` is what vllm-ascend's ``additional_config["enable_flashcomm1"]`` (and its
``VLLM_ASCEND_ENABLE_FLASHCOMM1``) map onto; the MoE communication policy reads it too.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from ascend_kernel.entry_points import normalise_name


class TpCommSettings(BaseModel):
    """How a forward pass's tensor-parallel partial sums are combined."""

    tp_comm: str = Field("auto", description="Force the tensor-parallel communication policy by name "
                         "(all-reduce, sequence-parallel).")
    sequence_parallel: bool = Field(
        False, description="Sequence parallelism for tensor-parallel communication (vllm-ascend's enable_flashcomm1, "
        "FlashComm v1): reduce-scatter after row-parallel layers, norms and the residual on the 1/TP token shard, "
        "all-gather before column-parallel ones, tokens padded to a multiple of TP; chosen per forward pass by its "
        "token count (sp_min_tokens). Llama and the Qwen3-MoE / Qwen2-MoE / DeepSeek-V2 MoE models, eager or compiled, "
        "the seam's layers (layer_ops ascend). The MoE communication policy reads it.")
    sp_min_tokens: int | None = Field(
        None, ge=1, description="Sequence parallelism runs on forward passes of at least this many tokens (others "
        "all-reduce). Unset: 1,000 for dense models (vllm-ascend's threshold), 1 (every pass) for MoE models.")

    @field_validator("tp_comm")
    @classmethod
    def _forced_name(cls, value: str) -> str:
        if not value or not value.strip():
            raise ValueError("must be a non-empty implementation name or 'auto'")
        return normalise_name(value)

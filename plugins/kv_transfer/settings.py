"""The settings the KV-transfer plugin reads (declared by its ``ascend_kernel_settings``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class KVTransferSettings(BaseModel):
    kv_transfer_pull_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Decode (kv_consumer) instances under Mooncake: the longest one pull of a prompt's KV pages "
        "waits for the producer's answer; then the request fails and its blocks are freed. Unset: vLLM's own bound "
        "(VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s). Must exceed VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT: until then "
        "a live producer may still write the pages into the consumer's blocks.",
    )

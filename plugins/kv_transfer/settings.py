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
    # prefill/decode proxy (ascend-kernel pd-proxy / serve-pd): its timeouts and health checks
    pd_proxy_timeout_s: float = Field(
        600.0, gt=0,
        description="pd-proxy: seconds a prefill or decode instance may take to answer a request (and serve-pd's "
        "proxy the same); pd-proxy --timeout overrides it.",
    )
    pd_proxy_connect_timeout_s: float = Field(
        10.0, gt=0, description="pd-proxy: seconds to open a connection to an instance.",
    )
    pd_proxy_health_interval_s: float = Field(
        5.0, gt=0,
        description="pd-proxy: seconds between health checks of each instance (GET /health); an instance that "
        "fails one leaves the rotation until a later check answers 200.",
    )
    pd_proxy_health_timeout_s: float = Field(
        5.0, gt=0, description="pd-proxy: seconds one instance health check may take before it counts as failed.",
    )

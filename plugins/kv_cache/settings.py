"""The settings the KV-cache layouts read (declared by the essential ``kv_cache_standard`` plugin).

Every layout places its tensors through :mod:`ascend_kernel_plugins.kv_cache.common`,
which reads them; declaring them in the one layout plugin that cannot be
disabled keeps a single owner.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class KVCacheSettings(BaseModel):
    kv_transfer_alignment_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1,
        description="Alignment of every KV tensor when a KV-transfer (PD) config is present (llmdatadist needs 2 MiB).",
    )

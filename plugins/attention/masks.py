"""Attention masks per state, from caches that grow and are never rebuilt per step.

Ascend's attention kernels take an explicit mask: masked cells hold ``-inf``
for float16 and ``1`` for other dtypes (the kernels read it as a flag), kept
cells hold 0. A causal mask of the largest length seen so far is cached per
(dtype, device); smaller requests are slices of it.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel_plugins.attention.states import AttentionState

#: PrefillCacheHit uses a fixed-size causal mask (the kernel tiles it)
CACHE_HIT_MASK_SIZE = 128


def masked_value(dtype: torch.dtype) -> float:
    return float("-inf") if dtype == torch.float16 else 1.0


class AttentionMaskBuilder:
    """Causal, split-fuse and pooling masks, each cached and grown by doubling."""

    __slots__ = ("pooling_cls", "_causal", "builds")

    def __init__(self, pooling_cls: bool = False) -> None:
        self.pooling_cls = pooling_cls
        self._causal: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self.builds = 0  # how many times a cache was (re)built: grows, never per step

    @classmethod
    def from_context(cls, ctx: Any) -> "AttentionMaskBuilder":
        model = ctx.vllm_config.model_config
        pooler = getattr(model, "pooler_config", None)
        pooling_type = getattr(pooler, "pooling_type", None) or getattr(pooler, "seq_pooling_type", None)
        return cls(pooling_cls=model.runner_type == "pooling" and str(pooling_type).upper() == "CLS")

    def causal(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[size, size]`` mask: cell (i, j) is masked when j > i."""
        key = (dtype, torch.device(device))
        cached = self._causal.get(key)
        if cached is None or cached.shape[0] < size:
            capacity = max(size, 2 * cached.shape[0] if cached is not None else size)
            upper = torch.ones(capacity, capacity, dtype=torch.bool, device=device).triu(1)
            cached = torch.zeros(capacity, capacity, dtype=dtype, device=device).masked_fill(
                upper, masked_value(dtype)
            )
            self._causal[key] = cached
            self.builds += 1
        return cached[:size, :size]

    def splitfuse(self, seq_lens: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
        """One row per scheduled token: key j is masked when j > the token's position."""
        max_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
        table = self.causal(max(max_len, 1), dtype, device)
        return table.index_select(0, positions.to(device=device, dtype=torch.long))[:, :max_len]

    def pooling(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """CLS pooling attends bidirectionally: nothing is masked."""
        return torch.zeros(size, size, dtype=dtype, device=device)

    def mask_for(self, state: AttentionState, seq_lens: torch.Tensor, positions: torch.Tensor,
                 dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        if self.pooling_cls:
            return self.pooling(int(seq_lens.max().item()), dtype, device)
        if state is AttentionState.ChunkedPrefill:
            return self.splitfuse(seq_lens, positions, dtype, device)
        if state is AttentionState.PrefillNoCache:
            return self.causal(int(seq_lens.max().item()), dtype, device)
        if state is AttentionState.PrefillCacheHit:
            return self.causal(CACHE_HIT_MASK_SIZE, dtype, device)
        return None

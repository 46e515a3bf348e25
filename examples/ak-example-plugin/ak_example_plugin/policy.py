"""The ``coarse`` attention-state policy: Prefill, Decode or Verify, from the batch's per-request arrays."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np


class CoarseState(enum.Enum):
    Prefill = "prefill"
    Decode = "decode"
    Verify = "verify"

    @property
    def is_prefill(self) -> bool:
        return self is CoarseState.Prefill


class CoarseStatePolicy:
    """First match wins: fresh prompts, one token each, one valid token each, anything else."""

    __slots__ = ()

    @classmethod
    def from_context(cls, ctx: Any) -> "CoarseStatePolicy":
        return cls()  # the rule reads no configuration

    def decide(self, batch: Any) -> CoarseState:
        n = batch.num_reqs
        scheduled = batch.num_scheduled_tokens[:n]
        if np.array_equal(batch.seq_lens[:n], scheduled):
            return CoarseState.Prefill
        if np.all(scheduled == 1):
            return CoarseState.Decode
        if np.all(batch.num_valid_tokens[:n] == 1):
            return CoarseState.Verify
        return CoarseState.Prefill

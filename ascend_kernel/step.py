"""What the runner tells per-step policies about a batch, and what it remembers.

:class:`StepBatch` is built once per step from arrays the runner already has;
:class:`StepTrace` counts what the chosen policies decided (attention state,
MoE method), which is how tests prove a scenario reached the state it meant to.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class StepBatch:
    """Shape of one scheduled batch, per request (arrays of length ``num_reqs``).

    ``seq_lens`` counts computed + scheduled tokens; ``num_valid_tokens`` is
    scheduled minus speculative draft tokens.
    """

    num_reqs: int
    seq_lens: np.ndarray
    num_scheduled_tokens: np.ndarray
    num_valid_tokens: np.ndarray
    total_tokens: int


@dataclass(slots=True)
class StepTrace:
    """Counters of per-step decisions (cheap: one dict increment per decision)."""

    steps: int = 0
    attention_states: Counter = field(default_factory=Counter)
    moe_methods: Counter = field(default_factory=Counter)
    sampler_calls: int = 0
    rejection_sampler_calls: int = 0
    drafter_calls: int = 0
    #: counters plugins keep per step (e.g. ``moe_tokens`` per method), by counter then key
    counters: dict[str, Counter] = field(default_factory=dict)

    def count(self, counter: str, key: str, amount: int = 1) -> None:
        """Add ``amount`` to ``counter[key]`` (a plugin's per-step fact; one dict update)."""
        bucket = self.counters.get(counter)
        if bucket is None:
            bucket = self.counters[counter] = Counter()
        bucket[key] += amount

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "attention_states": dict(self.attention_states),
            "moe_methods": {str(k): v for k, v in self.moe_methods.items()},
            "sampler_calls": self.sampler_calls,
            "rejection_sampler_calls": self.rejection_sampler_calls,
            "drafter_calls": self.drafter_calls,
            **{name: dict(bucket) for name, bucket in sorted(self.counters.items())},
        }

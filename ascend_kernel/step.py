"""What the runner tells per-step policies about a batch, what they answer, and what it remembers.

:class:`AttentionState` is the contract type of that answer: the attention
state policy returns one, a drafter names the members its verification
batches take, the backends and the conformance kit read the same members.
:class:`StepBatch` is built once per step from arrays the runner already has;
:class:`StepTrace` counts what the chosen policies decided (attention state,
MoE method), which is how tests prove a scenario reached the state it meant to.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import numpy as np


class AttentionState(enum.Enum):
    """Which kind of batch the attention kernels see (Ascend's fused kernels take different inputs per kind)."""

    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4

    @property
    def is_prefill(self) -> bool:
        """True when the batch carries prompt tokens (MoE comm avoids MC2-only paths then)."""
        return self in (AttentionState.PrefillNoCache, AttentionState.PrefillCacheHit, AttentionState.ChunkedPrefill)


class StepBatch:
    """Shape of one scheduled batch: per-request arrays and the facts the policies branch on.

    Arrays have one row per request (rows past ``num_reqs`` are ignored):
    ``seq_lens`` counts computed + scheduled tokens; ``num_valid_tokens`` is
    scheduled minus speculative draft tokens. The facts, each one bool:

    * ``fresh``: no request has computed tokens before this step (``seq_lens == num_scheduled_tokens``);
    * ``single_token``: every request schedules exactly one token;
    * ``single_valid``: every request has exactly one valid (non-draft) token.

    Built from arrays (``StepBatch(num_reqs, seq_lens, scheduled, valid, total)``,
    as tests and backends do), a fact is computed from the arrays when first
    read. The runner builds it with :meth:`of_step` from what vLLM already
    computed (``num_computed_tokens_cpu``, the step's token total, the draft
    dict): the facts are then set up front at the cost of a few scalar
    operations, and an array is only computed if a policy reads it. Whatever
    is not set is computed by ``__getattr__`` on first use and kept.
    """

    __slots__ = ("num_reqs", "num_scheduled_tokens", "total_tokens", "seq_lens", "num_valid_tokens",
                 "fresh", "single_token", "single_valid", "_num_computed_tokens", "_drafts", "_req_ids")

    def __init__(self, num_reqs: int, seq_lens: np.ndarray, num_scheduled_tokens: np.ndarray,
                 num_valid_tokens: np.ndarray, total_tokens: int) -> None:
        self.num_reqs = num_reqs
        self.seq_lens = seq_lens
        self.num_scheduled_tokens = num_scheduled_tokens
        self.num_valid_tokens = num_valid_tokens
        self.total_tokens = total_tokens

    @classmethod
    def of_step(cls, num_reqs: int, num_computed_tokens: np.ndarray, num_scheduled_tokens: np.ndarray,
                total_tokens: int, drafts: Mapping[str, Sequence[int]] | None = None,
                req_ids: Sequence[str] = ()) -> "StepBatch":
        """The runner's batch: ``num_computed_tokens`` before this step, ``total_tokens`` = sum of scheduled.

        Relies on two invariants of vLLM's scheduler, from which the facts
        follow by sums: every scheduled request has at least one token, and at
        least one that is not a draft (a request verifying drafts also feeds
        its last sampled token). So "one token each" is ``total_tokens ==
        num_reqs`` and "one valid token each" is ``total_tokens - draft tokens
        == num_reqs``. ``fresh`` reads the first request's computed count (a
        decode batch answers there) and counts the others only when it is 0.
        ``drafts`` maps request ids (of ``req_ids``, the rows in order) to
        their draft tokens.
        """
        batch = cls.__new__(cls)
        batch.num_reqs = num_reqs
        batch.num_scheduled_tokens = num_scheduled_tokens
        batch.total_tokens = total_tokens
        batch._num_computed_tokens = num_computed_tokens
        batch.fresh, batch.single_token, batch.single_valid = cls.facts_of_step(
            num_reqs, num_computed_tokens, total_tokens, drafts)
        if drafts:
            batch._drafts = drafts
            batch._req_ids = req_ids
        else:
            batch.num_valid_tokens = num_scheduled_tokens
        return batch

    @staticmethod
    def facts_of_step(num_reqs: int, num_computed_tokens: np.ndarray, total_tokens: int,
                      drafts: Mapping[str, Sequence[int]] | None) -> tuple[bool, bool, bool]:
        """``(fresh, single_token, single_valid)`` of a live step, by the sums :meth:`of_step` describes.

        The array form, for :meth:`of_step`. The runner's table lookup uses
        :func:`facts_of_schedule`, which gives the same tuple from the
        scheduler's output without touching an array.
        """
        fresh = not (num_reqs and num_computed_tokens[0]) and not np.count_nonzero(num_computed_tokens[:num_reqs])
        single = total_tokens == num_reqs
        if not drafts:
            return fresh, single, single
        return fresh, single, total_tokens - sum(map(len, drafts.values())) == num_reqs

    def __getattr__(self, name: str) -> Any:
        """Called only for a slot not yet set: computes the array or fact and keeps it."""
        n = self.num_reqs
        if name == "fresh":
            value = bool(np.array_equal(self.seq_lens[:n], self.num_scheduled_tokens[:n]))
        elif name == "single_token":
            value = bool(np.all(self.num_scheduled_tokens[:n] == 1))
        elif name == "single_valid":
            drafts = getattr(self, "_drafts", None)
            if drafts is not None:
                value = self.total_tokens - sum(map(len, drafts.values())) == n
            else:
                value = bool(np.all(self.num_valid_tokens[:n] == 1))
        elif name == "seq_lens" and hasattr(self, "_num_computed_tokens"):
            value = self._num_computed_tokens[:n] + self.num_scheduled_tokens[:n]
        elif name == "num_valid_tokens" and hasattr(self, "_drafts"):
            drafts = self._drafts
            num_draft = np.fromiter((len(drafts.get(r, ())) for r in self._req_ids[:n]), np.int64, n)
            value = self.num_scheduled_tokens[:n] - num_draft
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return (f"StepBatch(num_reqs={self.num_reqs}, seq_lens={self.seq_lens!r}, "
                f"num_scheduled_tokens={self.num_scheduled_tokens!r}, num_valid_tokens={self.num_valid_tokens!r}, "
                f"total_tokens={self.total_tokens})")


def facts_of_schedule(scheduler_output: Any, runner: Any) -> tuple[bool, bool, bool]:
    """``(fresh, single_token, single_valid)`` of a step, read from vLLM's ``SchedulerOutput`` first.

    The runner's hot path (a policy with ``decide_facts`` is answered from a
    table keyed by this tuple). A decode step is answered from Python lists
    and dicts the scheduler hands over, without touching an array: after the
    model's forward pass the caches are cold, and a numpy element read costs
    several times what these do there. ``fresh`` is false as soon as a
    cached request has computed tokens; only otherwise (new requests, or
    resumed ones) does it read the runner's
    ``input_batch.num_computed_tokens_cpu`` and count its rows, as
    :meth:`StepBatch.facts_of_step` does. The tuple equals that method's on
    the runner's arrays, because the runner fills them from these fields:
    each row's computed count from its request's ``num_computed_tokens``, one
    row per entry of ``num_scheduled_tokens``.
    """
    num_reqs = len(scheduler_output.num_scheduled_tokens)
    fresh = (not any(scheduler_output.scheduled_cached_reqs.num_computed_tokens)
             and not np.count_nonzero(runner.input_batch.num_computed_tokens_cpu[:num_reqs]))
    total = scheduler_output.total_num_scheduled_tokens
    single = total == num_reqs
    drafts = scheduler_output.scheduled_spec_decode_tokens
    if not drafts:
        return fresh, single, single
    return fresh, single, total - sum(map(len, drafts.values())) == num_reqs


class StateCounter(Protocol):
    """Steps counted for one attention state (the runner keeps one per state it has seen)."""

    name: str
    steps: int


@dataclass(slots=True)
class StepTrace:
    """Counters of per-step decisions (cheap: one slot increment per step, one dict increment per decision)."""

    #: the runner's per-state step counters (its step increments one, nothing else): see :attr:`attention_states`
    state_counters: list[StateCounter] = field(default_factory=list)
    moe_methods: Counter = field(default_factory=Counter)
    sampler_calls: int = 0
    rejection_sampler_calls: int = 0
    drafter_calls: int = 0
    #: counters plugins keep per step (e.g. ``moe_fallbacks`` per method), by counter then key
    counters: dict[str, Counter] = field(default_factory=dict)
    #: the same for amounts that live on the device (e.g. ``moe_tokens``): summed there, read when reported
    device_counters: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def attention_states(self) -> Counter:
        """Scheduled steps by the name of the attention state decided for them."""
        totals: Counter = Counter()
        for counter in self.state_counters:
            if counter.steps:
                totals[counter.name] += counter.steps
        return totals

    @property
    def steps(self) -> int:
        """Scheduled steps so far: every step decides one attention state (one count, not two, per step)."""
        return sum(counter.steps for counter in self.state_counters)

    def count(self, counter: str, key: str, amount: int = 1) -> None:
        """Add ``amount`` to ``counter[key]`` (a plugin's per-step fact; one dict update)."""
        bucket = self.counters.get(counter)
        if bucket is None:
            bucket = self.counters[counter] = Counter()
        bucket[key] += amount

    def count_on_device(self, counter: str, key: str, amount: Any) -> None:
        """Add a 0-d tensor to ``counter[key]`` without reading it.

        Reading a device tensor in the step (``int(t)``) waits for the device:
        on an NPU that is a host sync per call. The sum stays on the device
        until :meth:`as_dict` reads it, once per report.
        """
        bucket = self.device_counters.get(counter)
        if bucket is None:
            bucket = self.device_counters[counter] = {}
        total = bucket.get(key)
        bucket[key] = amount.detach().clone() if total is None else total.add_(amount)

    def _merged_counters(self) -> dict[str, dict[str, int]]:
        merged = {name: dict(bucket) for name, bucket in self.counters.items()}
        for name, bucket in self.device_counters.items():
            target = merged.setdefault(name, {})
            for key, total in bucket.items():
                target[key] = target.get(key, 0) + int(total)
        return merged

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "attention_states": dict(self.attention_states),
            "moe_methods": {str(k): v for k, v in self.moe_methods.items()},
            "sampler_calls": self.sampler_calls,
            "rejection_sampler_calls": self.rejection_sampler_calls,
            "drafter_calls": self.drafter_calls,
            **dict(sorted(self._merged_counters().items())),
        }

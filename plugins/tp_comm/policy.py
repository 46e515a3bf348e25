"""The per-pass choice between all-reduce and sequence parallelism, and the two policies that make it.

FlashComm v1 as vllm-ascend decides it: a MoE model runs sequence parallel on
every pass; a dense one only on passes above a token threshold, where the
saved all-reduce traffic and the norm on 1/TP of the tokens pay for the extra
all-gather. Tokens are padded to a multiple of the TP size so that every rank
holds an equal shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_REDUCE = "all_reduce"
SEQUENCE_PARALLEL = "sequence_parallel"
#: the step trace's counter of scheduled steps by choice (its keys: ALL_REDUCE, SEQUENCE_PARALLEL)
STEP_COUNTER = "sequence_parallel_steps"
DENSE_MIN_TOKENS = 1000
MOE_MIN_TOKENS = 1


def min_tokens_for(setting: int | None, is_moe: bool) -> int:
    """The fewest tokens a pass needs for sequence parallelism: the setting, else the model kind's default."""
    if setting is not None:
        return setting
    return MOE_MIN_TOKENS if is_moe else DENSE_MIN_TOKENS


def choose(num_tokens: int, min_tokens: int) -> str:
    """ALL_REDUCE or SEQUENCE_PARALLEL for a pass of ``num_tokens`` (an empty pass has nothing to shard)."""
    return SEQUENCE_PARALLEL if num_tokens >= max(min_tokens, 1) else ALL_REDUCE


@dataclass(frozen=True, slots=True)
class SequenceParallelPass:
    """What the layers of one sequence-parallel pass need: the real and the padded token counts.

    Published to vLLM's forward context as ``"tp_comm"``; each rank's shard
    holds ``padded_tokens // tp_size`` tokens.
    """

    num_tokens: int
    padded_tokens: int
    tp_size: int

    @classmethod
    def of(cls, num_tokens: int, tp_size: int) -> "SequenceParallelPass":
        return cls(num_tokens, -(-num_tokens // tp_size) * tp_size, tp_size)

    @property
    def pad_size(self) -> int:
        return self.padded_tokens - self.num_tokens

    @property
    def shard_tokens(self) -> int:
        return self.padded_tokens // self.tp_size


class AllReducePolicy:
    """vLLM's own communication: every row-parallel layer all-reduces (nothing per pass)."""

    __slots__ = ()
    name = "all-reduce"

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name}


class SequenceParallelPolicy:
    """FlashComm v1: sequence parallel on passes of at least ``min_tokens`` tokens, all-reduce on the others.

    ``shards_tokens`` tells the layers family to build and mark its
    sequence-parallel layers; ``select`` is the runner's per-pass call.
    """

    __slots__ = ("tp_size", "is_moe", "min_tokens", "_passes", "trace")
    name = "sequence-parallel"
    shards_tokens = True

    def __init__(self, tp_size: int, is_moe: bool, min_tokens: int) -> None:
        self.tp_size = tp_size
        self.is_moe = is_moe
        self.min_tokens = min_tokens
        #: one record per token count seen (bounded by the scheduler's token budget)
        self._passes: dict[int, SequenceParallelPass] = {}
        #: the step trace of the pass selected last (None: a dummy, profile or capture pass); the layers' op
        #: counts its calls and the bytes it sent there
        self.trace: Any = None

    def select(self, num_tokens: int, trace: Any = None) -> SequenceParallelPass | None:
        """This pass's record, or None (all-reduce); a scheduled step's choice is counted in ``trace``."""
        sequence_parallel = num_tokens >= self.min_tokens and num_tokens > 0
        self.trace = trace
        if trace is not None:
            trace.count(STEP_COUNTER, SEQUENCE_PARALLEL if sequence_parallel else ALL_REDUCE)
        if not sequence_parallel:
            return None
        record = self._passes.get(num_tokens)
        if record is None:
            record = self._passes[num_tokens] = SequenceParallelPass.of(num_tokens, self.tp_size)
        return record

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "tp_size": self.tp_size, "model_kind": "moe" if self.is_moe else "dense",
                "min_tokens": self.min_tokens}

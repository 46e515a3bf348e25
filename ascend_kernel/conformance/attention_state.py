"""Contract of the ``attention_state`` family: a state for every batch shape the runner can schedule.

The built object's ``decide(batch)`` is called with a
:class:`ascend_kernel.step.StepBatch` of each shape below, under each config
the policy accepts (chunked prefill on and off, n-gram, EAGLE and MTP speculation,
with the drafter the kernel would choose in ``ctx.chosen``). It must give:

* ``state-for-every-batch``: an object with a non-empty ``name`` and a boolean
  ``is_prefill`` for every shape (the runner publishes it; the MoE policy
  reads ``is_prefill``);
* ``prefill-flag``: ``is_prefill`` is True for a batch of fresh prompts and
  False for a batch of one-token decodes;
* ``facts-agree``: a policy with ``decide_facts(fresh, single_token,
  single_valid)`` (the runner then tabulates it at start-up and never calls
  ``decide`` in a step) answers every batch as ``decide`` does. Skipped
  without ``decide_facts``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip
from ascend_kernel.step import StepBatch

FAMILY = "attention_state"
#: the configs a policy is built under (each one it supports), first one decides the context reported
CONFIGS = ("llama", "llama-no-chunked-prefill", "llama-ngram", "llama-eagle", "qwen3_next-mtp")


def step_batch(seq_lens: list[int], scheduled: list[int], valid: list[int] | None = None) -> StepBatch:
    valid = scheduled if valid is None else valid
    return StepBatch(num_reqs=len(seq_lens), seq_lens=np.array(seq_lens, dtype=np.int32),
                     num_scheduled_tokens=np.array(scheduled, dtype=np.int32),
                     num_valid_tokens=np.array(valid, dtype=np.int32), total_tokens=int(sum(scheduled)))


#: shape name -> (seq_lens, scheduled tokens, valid tokens); seq_lens count computed + scheduled tokens
BATCHES: dict[str, tuple[list[int], list[int], list[int] | None]] = {
    "prefill": ([5, 7], [5, 7], None),
    "prefill-one-request": ([9], [9], None),
    "prefill-over-cached-prefix": ([12, 9], [5, 4], None),
    "decode": ([12, 9, 30], [1, 1, 1], None),
    "decode-one-request": ([40], [1], None),
    "mixed-decode-and-prefill": ([12, 6], [1, 6], None),
    "mixed-decode-and-chunk": ([12, 20], [1, 8], None),
    "spec-verify": ([15, 9], [4, 4], [1, 1]),
    "spec-verify-mixed-lengths": ([15, 9, 22], [4, 2, 3], [1, 1, 1]),
}


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS, each_config=True)
    if built:
        check([(found.label, obj) for found, obj in built], checks)


def check(policies: list[tuple[str, Any]], checks: Checks) -> None:
    """``policies``: (context label, policy object) for every kit config the entry supports."""

    def interface() -> str:
        for _, policy in policies:
            assert callable(getattr(policy, "decide", None)), f"{type(policy).__name__} has no decide(batch) method"
        return "decide(batch) is callable"

    checks.run("interface", interface)
    if not all(callable(getattr(p, "decide", None)) for _, p in policies):
        checks.skipped("state-for-every-batch", "no decide(batch) (see contract 'interface')")
        checks.skipped("prefill-flag", "no decide(batch) (see contract 'interface')")
        return
    decided: dict[tuple[str, str], Any] = {}

    def every_batch() -> str:
        names = set()
        for label, policy in policies:
            for shape, (seq_lens, scheduled, valid) in BATCHES.items():
                state = policy.decide(step_batch(seq_lens, scheduled, valid))
                where = f"batch '{shape}' under {label}"
                name = getattr(state, "name", None)
                assert isinstance(name, str) and name, f"{where}: decide returned {state!r}, which has no name"
                flag = getattr(state, "is_prefill", None)
                assert isinstance(flag, (bool, np.bool_)), \
                    f"{where}: state {name} has is_prefill={flag!r}, not a bool"
                decided[(label, shape)] = state
                names.add(name)
        return f"{len(BATCHES)} batch shapes x {len(policies)} config(s); states: {', '.join(sorted(names))}"

    def prefill_flag() -> str:
        if len(decided) < len(BATCHES) * len(policies):
            raise Skip("not every batch got a state (see contract 'state-for-every-batch')")
        for label, _ in policies:
            for shape in ("prefill", "prefill-one-request"):
                state = decided[(label, shape)]
                assert bool(state.is_prefill), \
                    f"batch '{shape}' under {label}: state {state.name} says is_prefill=False"
            for shape in ("decode", "decode-one-request"):
                state = decided[(label, shape)]
                assert not bool(state.is_prefill), \
                    f"batch '{shape}' under {label}: state {state.name} says is_prefill=True"
        return "fresh prompts are prefill, one-token decodes are not"

    def facts_agree() -> str:
        tabulated = [(label, p) for label, p in policies if getattr(p, "decide_facts", None) is not None]
        if not tabulated:
            raise Skip("no decide_facts: the runner asks decide(batch) every step")
        for label, policy in tabulated:
            for shape, (seq_lens, scheduled, valid) in BATCHES.items():
                batch = step_batch(seq_lens, scheduled, valid)
                expected = policy.decide(batch)
                got = policy.decide_facts(batch.fresh, batch.single_token, batch.single_valid)
                assert got == expected, f"batch '{shape}' under {label}: decide_facts gives " \
                    f"{getattr(got, 'name', got)!s}, decide gives {getattr(expected, 'name', expected)!s}"
        return f"decide_facts equals decide on {len(BATCHES)} batch shapes x {len(tabulated)} config(s)"

    checks.run("state-for-every-batch", every_batch)
    checks.run("prefill-flag", prefill_flag)
    checks.run("facts-agree", facts_agree)

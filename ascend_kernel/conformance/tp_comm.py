"""Contract of the ``tp_comm`` family: all-reduce with nothing per pass, or a per-pass choice the layers can use.

The policy is built under the kit's dense config, then:

* ``interface``: ``describe()`` is callable and returns a dict naming the policy; ``select``, where the
  object has it, is callable (an object without it is never asked per pass: every pass all-reduces);
* ``pass-record``: ``select(num_tokens, trace)`` for passes of 1 to 4096 tokens returns None (all-reduce) or
  a record with ``num_tokens`` (the pass's), ``padded_tokens`` (the next multiple of ``tp_size``) and
  ``tp_size``, and counts each call with a trace exactly once in one trace counter whose name says
  "sequence"; a call without a trace (a dummy or profile pass) is answered too.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip
from ascend_kernel.step import StepTrace

FAMILY = "tp_comm"
CONFIGS = ("llama",)
BATCHES = (1, 2, 7, 8, 999, 1000, 1001, 4096)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if built:
        check(built[0][1], checks)


def check(policy: Any, checks: Checks) -> None:
    def interface() -> str:
        described = policy.describe()
        assert isinstance(described, dict) and described.get("policy"), \
            f"describe() returned {described!r}, not a dict naming the policy"
        select = getattr(policy, "select", None)
        assert select is None or callable(select), f"{type(policy).__name__}.select is not callable"
        return "describe()" + (", select(num_tokens, trace)" if select is not None else " (no per-pass call)")

    def pass_record() -> str:
        if getattr(policy, "select", None) is None:
            raise Skip("no select: every pass all-reduces and the runner calls nothing per pass")
        trace, chosen = StepTrace(), 0
        for n in BATCHES:
            record = policy.select(n, trace)
            if record is None:
                continue
            chosen += 1
            tp = record.tp_size
            assert record.num_tokens == n, f"select({n}) returned a record of {record.num_tokens} tokens"
            assert record.padded_tokens % tp == 0 and 0 <= record.padded_tokens - n < tp, \
                f"select({n}) padded to {record.padded_tokens}, not the next multiple of TP {tp}"
        counters = {name: sum(c.values()) for name, c in trace.counters.items()}
        assert len(counters) == 1 and "sequence" in next(iter(counters)), \
            f"the choices were counted under {sorted(counters)}: one counter whose name says 'sequence' expected"
        assert next(iter(counters.values())) == len(BATCHES), f"{counters} for {len(BATCHES)} passes"
        policy.select(BATCHES[-1], None)  # a dummy or profile pass: no trace to count in
        return f"{chosen} of {len(BATCHES)} passes sequence parallel"

    checks.run("interface", interface)
    checks.run("pass-record", pass_record)

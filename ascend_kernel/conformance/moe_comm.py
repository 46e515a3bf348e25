"""Contract of the ``moe_comm`` family: a policy that names a method of the table, or None without experts.

The policy is built with ``ctx.tables["moe_comm_method"]`` (every installed
method the context supports, as the kernel builds it), under a dense model
and under an MoE model (tiny Qwen2-MoE), then asked
``select(num_tokens, with_prefill)`` for batches of 1 to 4096 tokens, prefill
and decode:

* ``interface``: ``select`` is callable;
* ``no-method-without-experts``: for the dense model every answer is None;
* ``selects-from-table``: for the MoE model every answer is one of the table's
  method objects (or None), and a method with a ``capacity`` is only given
  batches that fit it;
* ``is-moe-flag``: a policy with an ``is_moe`` attribute (the runner never
  calls ``select`` when it is False) says False for the dense model and True
  for the MoE model. Skipped without the attribute.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip

FAMILY = "moe_comm"
CONFIGS = ("llama", "qwen2_moe")
BATCHES = (1, 2, 7, 64, 511, 512, 513, 4096)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS, each_config=True)
    if not built:
        return

    def interface() -> str:
        for _, policy in built:
            assert callable(getattr(policy, "select", None)), f"{type(policy).__name__} has no select(...) method"
        return "select(num_tokens, with_prefill)"

    def answers(moe: bool) -> list[tuple[str, Any, Any, int, bool]]:
        out = []
        for found, policy in built:
            if bool(found.ctx.vllm_config.model_config.is_moe) != moe:
                continue
            for n in BATCHES:
                for prefill in (True, False):
                    out.append((found.label, found.ctx, policy.select(n, prefill), n, prefill))
        if not out:
            raise Skip(f"not supported under the kit's {'MoE' if moe else 'dense'} config")
        return out

    def dense() -> str:
        for label, _, method, n, prefill in answers(moe=False):
            assert method is None, f"{label}: select({n}, with_prefill={prefill}) returned {method!r} for a model " \
                "without experts"
        return "None for every batch of a dense model"

    def moe() -> str:
        names = set()
        for label, ctx, method, n, prefill in answers(moe=True):
            if method is None:
                continue
            table = ctx.tables.get("moe_comm_method", {})
            assert any(method is m for m in table.values()), \
                f"{label}: select({n}, with_prefill={prefill}) returned {method!r}, not a method of the table " \
                f"({', '.join(sorted(table))})"
            capacity = getattr(method, "capacity", None)
            assert capacity is None or n <= capacity, \
                f"{label}: select({n}, ...) returned '{method.name}', whose capacity is {capacity}"
            names.add(getattr(method, "name", repr(method)))
        return f"methods chosen: {', '.join(sorted(names)) or 'none'}"

    def is_moe_flag() -> str:
        flagged = [(found, policy) for found, policy in built if hasattr(policy, "is_moe")]
        if not flagged:
            raise Skip("no is_moe attribute: the runner asks select(...) every forward pass")
        for found, policy in flagged:
            expected = bool(found.ctx.vllm_config.model_config.is_moe)
            assert isinstance(policy.is_moe, bool) and policy.is_moe == expected, \
                f"{found.label}: is_moe is {policy.is_moe!r} for a model {'with' if expected else 'without'} " \
                "experts (False makes the runner skip select)"
        return f"is_moe matches the model under {len(flagged)} config(s)"

    checks.run("interface", interface)
    checks.run("no-method-without-experts", dense)
    checks.run("selects-from-table", moe)
    checks.run("is-moe-flag", is_moe_flag)

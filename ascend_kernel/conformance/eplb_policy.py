"""Contract of the ``eplb_policy`` family: vLLM's ``AbstractEplbPolicy`` call, with a valid placement.

The built object is called as vLLM's ``EplbState.rearrange`` calls it:
``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices)`` with a skewed load of 2 layers x 4 logical
experts, 6 physical slots on 2 ranks, and must give:

* ``placement``: an integer tensor [layers, physical slots] in which every
  logical expert of every layer holds at least one slot (a policy that drops
  an expert would leave its tokens nowhere);
* ``balance``: no rank carries more of the load under the new placement than
  the hottest rank did under the old one (each expert's load split evenly
  over its replicas, as the MoE layer's hash spreads it).
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "eplb_policy"
CONFIGS = ("llama",)
LOAD = torch.tensor([[90, 5, 3, 2], [1, 60, 60, 1]])
OLD = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]])
RANKS = 2


def _hottest(placement: torch.Tensor) -> float:
    load = LOAD.double()
    replicas = torch.zeros_like(load).scatter_add_(1, placement, torch.ones_like(placement, dtype=torch.float64))
    per_slot = torch.gather(load / replicas.clamp_min(1), 1, placement)
    return float(per_slot.reshape(placement.shape[0], RANKS, -1).sum(dim=(0, 2)).max())


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    _, policy = built[0]
    result: dict[str, torch.Tensor] = {}

    def placement() -> str:
        new = policy.rebalance_experts(LOAD.clone(), OLD.shape[1], 1, 1, RANKS, OLD.clone())
        assert isinstance(new, torch.Tensor) and not new.is_floating_point(), f"got {type(new).__name__}"
        assert tuple(new.shape) == tuple(OLD.shape), f"shape {tuple(new.shape)}, wanted {tuple(OLD.shape)}"
        for layer, row in enumerate(new.tolist()):
            assert set(row) == {0, 1, 2, 3}, f"layer {layer} places {sorted(set(row))}, not every expert"
        result["new"] = new.long()
        return "every logical expert placed, [layers, physical] integers"

    checks.run("placement", placement)

    def balance() -> str:
        if "new" not in result:
            raise AssertionError("no placement to measure")
        before, after = _hottest(OLD), _hottest(result["new"])
        assert after <= before + 1e-9, f"hottest rank's load {after:.1f} > {before:.1f} before"
        return f"hottest rank's load {before:.1f} -> {after:.1f}"

    checks.run("balance", balance)

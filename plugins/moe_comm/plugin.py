"""The MoE communication plugin."""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.moe_comm.settings import MoECommSettings


@hookimpl
def ascend_kernel_settings() -> type[MoECommSettings]:
    return MoECommSettings


@hookimpl
def ascend_kernel_moe_comm_policies() -> list[Implementation]:
    from ascend_kernel_plugins.moe_comm import policy

    return [
        Implementation(
            family="moe_comm",
            name="ascend",
            factory=policy.AscendMoECommPolicy.from_context,
            description="all-gather without EP (or without an Ascend SoC); MC2 under capacity, else all-gather (A2) / all-to-all (A3)",
        )
    ]



@hookimpl
def ascend_kernel_model_loaded(runner: Any) -> list[str] | None:
    """With DP > 1, every MoE layer (the drafter's too) enters through vLLM's opaque op (:mod:`.opaque_forward`)."""
    from ascend_kernel_plugins.moe_comm import opaque_forward

    if not opaque_forward.needed(runner.vllm_config):
        return None
    drafter = getattr(getattr(runner, "drafter", None), "model", None)
    models = [runner.get_model(), *([drafter] if isinstance(drafter, torch.nn.Module) else [])]
    changed = opaque_forward.enter_through_opaque_op(models)
    return [f"{changed} MoE layers enter through vllm.moe_forward (DP > 1: its gather is data dependent)"] \
        if changed else None

"""The MoE communication plugin."""

from __future__ import annotations

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


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


@hookimpl
def ascend_kernel_configure(settings, vllm_config, device):
    from ascend_kernel.errors import SettingsError

    if settings.enable_mc2_hierarchy_comm and settings.enable_fused_mc2:
        raise SettingsError(
            "fused MC2 cannot be used with hierarchical MC2 communication: set "
            "ASCEND_KERNEL_ENABLE_FUSED_MC2=0 or ASCEND_KERNEL_ENABLE_MC2_HIERARCHY_COMM=0"
        )
    return None

"""The graph plugin: eager everywhere, ACL graphs on an NPU."""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

ASCEND_KERNEL_ESSENTIAL = "the runner needs a graph mode, if only 'eager'"


@hookimpl
def ascend_kernel_graph_modes() -> list[Implementation]:
    from ascend_kernel_plugins.graph import modes

    return [
        Implementation(family="graph", name="eager", factory=lambda ctx: modes.EagerMode(),
                       description="no capture; every step runs eagerly"),
        Implementation(family="graph", name="aclgraph", factory=modes.AclGraphMode.from_context,
                       supports=modes.aclgraph_supported, priority=10,
                       description="ACL graph capture/replay at the configured sizes (NPU)"),
    ]


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any):
    from ascend_kernel_plugins.graph import modes

    if device.kind != "npu":
        return None
    return modes.resolve_npu_graph_config(vllm_config)

"""The graph plugin: eager everywhere, ACL graphs on an NPU, static-shape artifacts on a CPU (``cpu-graph``).

``cpu-graph`` is never the automatic choice (its priority is below eager's):
it costs start-up time (a compile per piece and capture size), so it runs only
when ``graph_mode`` names it; see docs/graph-capture.md.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.graph.settings import GraphSettings

ASCEND_KERNEL_ESSENTIAL = "the runner needs a graph mode, if only 'eager'"


@hookimpl
def ascend_kernel_settings() -> type[GraphSettings]:
    return GraphSettings


@hookimpl
def ascend_kernel_graph_modes() -> list[Implementation]:
    from ascend_kernel_plugins.graph import cpu_graph, modes

    return [
        Implementation(family="graph", name="eager", factory=lambda ctx: modes.EagerMode(),
                       description="no capture; every step runs eagerly"),
        Implementation(family="graph", name="aclgraph", factory=modes.AclGraphMode.from_context,
                       supports=modes.aclgraph_supported, priority=10,
                       description="ACL graph capture/replay at the configured sizes (NPU)"),
        Implementation(family="graph", name=cpu_graph.NAME, factory=cpu_graph.CpuGraphMode.from_context,
                       supports=cpu_graph.cpu_graph_supported, priority=-10,
                       description="static per-size compiled pieces, captured and replayed by vLLM's "
                       "capture loop and dispatcher (CPU; only when asked for)"),
    ]


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any):
    from ascend_kernel_plugins.graph import cpu_graph, inductor_fixups, modes

    if device.kind == "npu":
        return modes.resolve_npu_graph_config(vllm_config, settings.graph_capture_mode)
    changes = []
    if settings.forced("graph_mode") == cpu_graph.NAME:
        changes += cpu_graph.resolve_cpu_graph_config(vllm_config, settings.graph_capture_sizes,
                                                      cpu_graph.chosen_capture_mode(settings))
    return changes + inductor_fixups.compilation_fixups(vllm_config)

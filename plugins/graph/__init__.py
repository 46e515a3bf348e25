"""Graph-capture family: eager, ACL graphs on an NPU, static per-size compiled pieces on a CPU (cpu-graph).

Public surface for other families (import these from here, never from the
family's modules): the capture session a backend consults while a graph is
captured, and the hook through which a backend updates its captured
parameters before a replay.
"""

from ascend_kernel_plugins.graph.capture_session import active_full_capture, register_replay_preparer

__all__ = ["active_full_capture", "register_replay_preparer"]

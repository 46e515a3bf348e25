"""Attention family: backend choice, per-step attention state, masks.

Public surface for other families (import these from here, never from the
family's modules): the attention backend a CPU host will run for a setting and
a config (cpu-graph refuses what that backend cannot capture). The attention
state itself is the core's contract type, :class:`ascend_kernel.step.AttentionState`.
"""

from ascend_kernel_plugins.attention.backends import cpu_backend_choice

__all__ = ["cpu_backend_choice"]

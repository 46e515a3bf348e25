"""MoE communication family: which collective moves tokens to experts, per batch.

Public surface for other families (import these from here, never from the
family's modules): the kernel's MoE method over vLLM's fused-MoE layer, which a
quantized-experts method extends, and why it cannot serve a layer. They load
on first use: the layer module imports vLLM's fused-MoE layer, and the family's
entry points (read whenever settings load) stay light. The experts and
process-group types every method works with live on the ops seam
(:mod:`ascend_kernel.ops.moe_experts`, :mod:`ascend_kernel.ops.moe_parallel`).
"""

from typing import Any

__all__ = ["AscendUnquantizedFusedMoEMethod", "unserved_reason"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ascend_kernel_plugins.moe_comm import layer

        return getattr(layer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

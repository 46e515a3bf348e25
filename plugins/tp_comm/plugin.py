"""The TP-communication plugin: all-reduce (vLLM's own), or sequence parallel (FlashComm v1) per forward pass.

``sequence-parallel`` is supported only where its mechanism runs: the seam's
layers (``layer_ops`` ascend: the row-parallel linear that hands on partial
sums, the norm whose opaque op combines them per pass), a Llama-shaped dense
model or a MoE model of the architectures listed (any MoE comm method: the
MoE layer hands on partial sums too), one pipeline stage; eager, compiled or captured alike (the choice is
read at run time inside the op, never fixed in a traced graph). While ``sequence_parallel`` is on, ``all-reduce`` steps
aside, so a configuration that asks for sequence parallelism and cannot have
it stops at start-up with every reason, never runs all-reduce in silence.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.tp_comm.policy import AllReducePolicy, SequenceParallelPolicy, min_tokens_for
from ascend_kernel_plugins.tp_comm.settings import TpCommSettings

ASCEND_KERNEL_ESSENTIAL = "the runner needs a TP-communication policy, if only vLLM's all-reduce"

#: the architectures whose decoder layers the sequence-parallel layers were checked on (norm, attention with a
#: row-parallel o_proj, norm, MLP with a row-parallel down_proj, residual through the norms, a final norm)
DENSE_ARCHITECTURES = frozenset({"LlamaForCausalLM"})
#: the MoE ones: the same, with vLLM's MoE layer (its runner's final all-reduce skipped) in place of the MLP
MOE_ARCHITECTURES = frozenset({"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM"})
ARCHITECTURES = DENSE_ARCHITECTURES | MOE_ARCHITECTURES
ASKED = ("ASCEND_KERNEL_SEQUENCE_PARALLEL, or vllm-ascend's additional_config enable_flashcomm1 or "
         "VLLM_ASCEND_ENABLE_FLASHCOMM1")
#: vLLM's speculative methods whose drafter reads the target's hidden states between decoder layers
#: (``hidden_states + residual``, vLLM's ``_maybe_add_hidden_state``): under the sequence-parallel layers those are
#: partial sums and a residual shard, in every pass
AUX_HIDDEN_STATE_METHODS = frozenset({"eagle3", "extract_hidden_states", "dflash", "dspark"})


@hookimpl
def ascend_kernel_settings() -> type[TpCommSettings]:
    return TpCommSettings


def _parallel(vllm_config: Any) -> Any:
    return getattr(vllm_config, "parallel_config", None)


def tp_size(vllm_config: Any) -> int:
    return int(getattr(_parallel(vllm_config), "tensor_parallel_size", 1) or 1)


def is_moe(vllm_config: Any) -> bool:
    return bool(getattr(getattr(vllm_config, "model_config", None), "is_moe", False))


def _sequence_parallel_supported(ctx: Any) -> str | None:
    if not ctx.settings.sequence_parallel:
        return f"not asked for (by {ASKED})"
    config = ctx.vllm_config
    if tp_size(config) < 2:
        return ("tensor parallel size 1: sequence parallelism shards the tokens over the TP group and replaces its "
                "all-reduce, and there is neither (vllm-ascend requires TP > 1 for FlashComm v1 too); drop "
                "enable_flashcomm1 / ASCEND_KERNEL_SEQUENCE_PARALLEL or raise --tensor-parallel-size")
    if not getattr(ctx.chosen.get("layer_ops"), "sequence_parallel_layers", False):
        return ("the chosen layer ops have no sequence-parallel norm and row-parallel layer: "
                "set ASCEND_KERNEL_LAYER_OPS=ascend")
    model = getattr(config, "model_config", None)
    architectures = set(getattr(getattr(model, "hf_config", None), "architectures", None) or ())
    if model is not None and not architectures & ARCHITECTURES:
        return (f"architecture {sorted(architectures)}: sequence parallelism is built for "
                f"{', '.join(sorted(ARCHITECTURES))} decoder layers so far")
    if int(getattr(_parallel(config), "pipeline_parallel_size", 1) or 1) > 1:
        return "pipeline parallelism: the tokens a stage hands on would be a shard"
    method = getattr(getattr(config, "speculative_config", None), "method", None)
    if method in AUX_HIDDEN_STATE_METHODS:
        return (f"speculative method {method}: its drafter reads the target's hidden states between decoder layers, "
                f"which the sequence-parallel layers hand on as partial sums; use ngram, eagle, mtp or a draft model")
    return None


def _all_reduce_supported(ctx: Any) -> str | None:
    if ctx.settings.sequence_parallel:
        return f"sequence parallelism is asked for (by {ASKED})"
    return None


def _sequence_parallel(ctx: Any) -> SequenceParallelPolicy:
    moe = is_moe(ctx.vllm_config)
    return SequenceParallelPolicy(tp_size(ctx.vllm_config), moe, min_tokens_for(ctx.settings.sp_min_tokens, moe))


@hookimpl
def ascend_kernel_tp_comm_policies() -> list[Implementation]:
    return [
        Implementation(family="tp_comm", name="all-reduce", factory=lambda ctx: AllReducePolicy(),
                       supports=_all_reduce_supported, priority=10,
                       description="all-reduce after every row-parallel layer (vLLM's own), nothing per pass"),
        Implementation(family="tp_comm", name="sequence-parallel", factory=_sequence_parallel,
                       supports=_sequence_parallel_supported, priority=20,
                       description="FlashComm v1: reduce-scatter, norm and residual on the token shard, all-gather; "
                       "per pass above sp_min_tokens"),
    ]

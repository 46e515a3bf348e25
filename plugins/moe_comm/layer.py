"""The kernel's MoE layer: vLLM's unquantized MoE method, with the routed experts run by a comm method.

vLLM 0.32 builds every unquantized MoE layer's expert computation through the
``UnquantizedFusedMoEMethod`` custom op, which an out-of-tree platform may
replace by class name (like the layer ops). The replacement keeps vLLM's
weights, weight loading, router, shared experts and output reduction, and
replaces what runs on the routed experts, per batch:

    routing (``moe_gating_top_k_softmax`` for plain softmax top-k, else vLLM's router)
    -> method.dispatch -> expert MLP (grouped matmul, SwiGLU, grouped matmul) -> method.combine

where ``method`` is the object the runner published for this forward pass.
Its output is this rank's partial sum; vLLM's TP all-reduce after the layer
completes it, as it completes the shared experts' partial sums (the method
never reduces over the tensor-parallel group itself).

Under vLLM's compilation (Dynamo traces the model once) the routed-expert
step is one registered torch op (``ascend_kernel::moe_routed_experts``), as
vLLM's own ``moe_forward`` is on GPUs: the op finds the layer by name in the
forward context (the engine running it, not a process-wide table; the name
is what a compiled graph cached on disk can keep) and reads the comm method
there when it *runs*, so every batch still gets its own method, and the
collectives, data-dependent shapes and host reads of the comm methods never
enter a traced graph. Gating is a seam op of its own (also opaque). At TP=1
without expert parallelism on a CPU host both are traced instead (vLLM-CPU's
fused kernel over the whole batch, as stock does; ``traced_experts.py`` says
where and why).

Layers the seam kernels do not cover (another activation, biased or clamped
experts, router weights applied to the input) keep vLLM's own kernel, with
the reason logged; with expert parallelism they stop start-up instead, since
vLLM-CPU's MoE kernel crashes there (it indexes local experts by global id).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.compiler import is_compiling
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.oot_ops import register_oot
from ascend_kernel.ops import get_ops
from ascend_kernel.ops.opaque import define_op_once
from ascend_kernel.runner.kernel_runner import current_trace
from ascend_kernel_plugins.moe_comm.eplb_map import TokenHashes, to_physical
from ascend_kernel.ops.moe_experts import LocalExperts, gather_expert_maps, slot_table
from ascend_kernel_plugins.moe_comm.methods.base import MoECommMethod, run_method
from ascend_kernel_plugins.moe_comm import traced_experts
from ascend_kernel.ops.moe_parallel import MoEParallel

logger = logging.getLogger("ascend_kernel")
REPLACED = "UnquantizedFusedMoEMethod"


def unserved_reason(layer: Any, moe: Any) -> str | None:
    """Why the seam's expert MLP cannot compute this layer (None when it can)."""
    activation = getattr(layer.activation, "value", layer.activation)
    if activation != "silu" or not moe.is_act_and_mul:
        return f"activation {activation!r} (the seam runs gated SiLU: swiglu)"
    if moe.has_bias:
        return "experts with biases"
    if getattr(layer, "swiglu_limit", None) is not None:
        return "clamped SwiGLU"
    if layer.apply_router_weight_on_input:
        return "router weights applied to the input"
    return None


def plain_softmax_routing(layer: Any) -> bool:
    """Routing that ``moe_gating_top_k_softmax`` computes: softmax over all experts, top-k."""
    return (layer.scoring_func == "softmax" and not layer.use_grouped_topk
            and layer.custom_routing_function is None and layer.e_score_correction_bias is None)


class AscendUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method whose routed experts run through the batch's comm method."""

    def __init__(self, moe: Any) -> None:
        super().__init__(moe)
        kernel = kernel_mod.current()
        self.seam_ops = get_ops(kernel.settings.ops_provider, kernel.device_info.kind)
        self.trace_experts_setting = bool(kernel.settings.moe_trace_experts)  # this plugin declares it
        self.compiled = traced_experts.compiled_model()
        #: Dynamo traces the routed experts under compilation (traced_experts.py), decided after loading
        self.traced_experts = False
        self.local_experts: LocalExperts | None = None
        self.parallel = MoEParallel.single()
        self.seam_gating = False
        self.top_k = moe.experts_per_token
        self.renormalize = False
        #: vLLM's EplbLayerState of this layer under EPLB (the EPLB plugin attaches it), else None
        self.eplb: Any = None

    @property
    def is_monolithic(self) -> bool:
        # monolithic = the method routes from the router logits itself (the seam's gating op)
        if self.local_experts is None:
            return super().is_monolithic
        return self.seam_gating

    def process_weights_after_loading(self, layer: Any) -> None:
        reason = unserved_reason(layer, self.moe)
        if reason is not None and self.moe.moe_parallel_config.use_ep:
            raise RuntimeError(
                f"MoE layer {layer.layer_name} cannot run with expert parallelism: the kernel's MoE comm methods "
                f"do not serve {reason}, and vLLM's own kernel for it is not expert-parallel on this platform "
                "(vLLM-CPU's crashes). Run without enable_expert_parallel.")
        if reason is not None:
            logger.warning("ascend-kernel: MoE layer %s keeps vLLM's kernel: %s", layer.layer_name, reason)
            return super().process_weights_after_loading(layer)
        self.parallel = MoEParallel.from_vllm(self.moe.moe_parallel_config)
        local = layer.local_num_experts
        maps = gather_expert_maps(layer.expert_map, layer.global_num_experts, _metadata_group(self.parallel),
                                  self.parallel.ep_size)
        self.local_experts = self.build_local_experts(layer, slot_table(maps, local), local)
        self.seam_gating = plain_softmax_routing(layer)
        self.renormalize = bool(layer.renormalize)
        self.layer_name = layer.layer_name  # the routed-experts op finds this method by it, in the forward context
        self.decide_traced_experts()

    def decide_traced_experts(self) -> None:
        """Trace or keep opaque the routed experts under compilation (traced_experts.py); recorded for the report."""
        policy = kernel_mod.current().plan.moe_comm if kernel_mod.current().plan is not None else None
        reason = traced_experts.traced_experts_reason(
            enabled=self.trace_experts_setting, compiled=self.compiled, tp_size=self.moe.moe_parallel_config.tp_size,
            parallel=self.parallel, experts=self.local_experts, policy=policy, eplb=self.eplb)
        self.traced_experts = reason is None
        traced_experts.record(policy, reason)

    def build_local_experts(self, layer: Any, slot_of: torch.Tensor, local: int) -> LocalExperts:
        """This rank's experts in the layout their kernel wants, stored once in place of vLLM's copy.

        Prepacked for vLLM-CPU's fused kernel, or transposed for the seam's
        grouped matmul. A subclass with other weights (int8 experts) builds
        its own :class:`LocalExperts`; everything else (routing, comm methods)
        is shared.
        """
        experts = LocalExperts.build(layer.w13_weight.data, layer.w2_weight.data, slot_of, local, self.seam_ops)
        kernel = experts.fused or experts
        layer.w13_weight.data, layer.w2_weight.data = kernel.w13, kernel.w2
        return experts

    def attach_eplb(self, layer_state: Any) -> None:
        """Serve vLLM's live logical->physical map and record this layer's load (the EPLB plugin calls it)."""
        if self.local_experts is None:
            raise RuntimeError(f"MoE layer {getattr(self, 'layer_name', '?')} keeps vLLM's kernel and cannot join EPLB")
        self.eplb = layer_state
        self.traced_experts = False  # expert ids are mapped and counted per batch on the host
        self.token_hashes = TokenHashes()  # this layer's table of token hashes (eplb_map.py)

    def apply(self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts: Any, shared_experts_input: torch.Tensor | None) -> torch.Tensor:
        if self.local_experts is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        return self.routed_experts(x, topk_weights, topk_ids)

    def apply_monolithic(self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.local_experts is None:
            return super().apply_monolithic(layer, x, router_logits, input_ids)
        weights, ids = self.seam_ops.moe_gating_top_k_softmax(router_logits, self.top_k)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.routed_experts(x, weights, ids)

    def routed_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """One opaque op while Dynamo traces (it finds this method again by layer name); eagerly, a direct call."""
        if is_compiling():
            if self.traced_experts:  # TP=1, no EP, vLLM-CPU's fused kernel: Dynamo traces it (traced_experts.py)
                return MoECommMethod.single_rank_weighted_mlp(x, topk_weights, topk_ids, self.local_experts)
            return torch.ops.ascend_kernel.moe_routed_experts(x, topk_weights, topk_ids, self.layer_name)
        return self.run_experts(x, topk_weights, topk_ids)

    def run_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's partial MoE output through the batch's comm method (runs eagerly, inside the op)."""
        method = get_forward_context().additional_kwargs.get("moe_comm_method")
        if method is None:
            raise RuntimeError("no MoE comm method was published for this forward pass: the ascend-kernel runner "
                               "must drive models whose MoE layers the moe_comm plugin replaced")
        if self.eplb is not None:  # logical -> physical (replicas included), the load recorded
            topk_ids = to_physical(topk_ids, self.eplb, self.token_hashes)
        out, computed = run_method(method, x, topk_weights, topk_ids, self.local_experts, self.parallel)
        trace = current_trace()
        if trace is not None:
            if isinstance(computed, int):
                trace.count("moe_tokens", method.name, computed)
            else:
                trace.count_on_device("moe_tokens", method.name, computed)
        return out


def _routed_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    layer_name: str) -> torch.Tensor:
    method = get_forward_context().no_compile_layers[layer_name].routed_experts.quant_method
    return method.run_experts(x, topk_weights, topk_ids)


def _routed_experts_fake(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                         layer_name: str) -> torch.Tensor:
    return torch.empty_like(x)


define_op_once("moe_routed_experts", "Tensor x, Tensor topk_weights, Tensor topk_ids, str layer_name) -> Tensor",
               _routed_experts, _routed_experts_fake)



def _metadata_group(parallel: MoEParallel) -> Any:
    """The host-side (gloo) twin of the EP group, for the one-off exchange of expert maps."""
    if parallel.ep_size == 1:
        return None
    from vllm.distributed import get_ep_group

    return get_ep_group().cpu_group


def register() -> list[str]:
    """Register the replacement once per process; another class already there is an error."""
    register_oot(REPLACED, AscendUnquantizedFusedMoEMethod, "disable one of the plugins that register it")
    return [f"vllm.model_executor.layers.fused_moe.{REPLACED}"]

"""Sequence parallelism's mechanism in the seam's layers (FlashComm v1), chosen per forward pass at run time.

The TP-communication family chooses per forward pass and publishes the choice
in vLLM's forward context under ``"tp_comm"`` (a record; None: all-reduce).
The choice is read at run time inside one opaque op, never while a graph is
traced, so a model compiled once (vLLM's default compilation) or captured per
size (cpu-graph) still makes it on every pass:

* a marked row-parallel linear (a decoder layer's ``o_proj`` and
  ``down_proj``) returns its partial sums, in every pass; so does a marked
  MoE layer (vLLM's MoE runner skips its final all-reduce: the routed and
  shared experts' partial sums, whatever the MoE comm method);
* the marked norm after it (a decoder layer's two norms, the model's final
  norm) calls ``ascend_kernel::tp_add_rms_norm`` on those partial sums, the
  residual and its weight. In an all-reduce pass the op all-reduces, adds and
  normalises (vLLM's own order of work); in a sequence-parallel pass it
  reduce-scatters, adds and normalises this rank's 1/TP token shard, and
  all-gathers the normed shards for the next column-parallel layer
  (``qkv_proj``, ``gate_up_proj``) or the lm head
  (:func:`ascend_kernel.ops.sequence_parallel.combine_add_rms_norm`).

Both choices keep every tensor the graph sees at the pass's full token count
(the residual the op returns holds this rank's shard rows; the others are never read, nor written),
so a traced graph's shapes hold for both. The first layer's input norm runs
without a residual on the embedding's full output, as in an all-reduce pass.
Only what :func:`mark` marks changes: other norms (Qwen3's per-head q/k
norms) and row-parallel layers (a vision tower's) keep vLLM's behaviour.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.compiler import is_compiling
from vllm.distributed import get_tp_group, split_tensor_along_last_dim
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.linear import RowParallelLinear, UnquantizedLinearMethod

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops.opaque import define_op_once, provider_for, provider_handle
from ascend_kernel.ops.sequence_parallel import combine_add_rms_norm
from ascend_kernel.oot_ops import register_oot
from ascend_kernel.upstream import dispatch_mode_depth

#: the forward-context key the TP-communication policy's choice is published under
CONTEXT_KEY = "tp_comm"
#: step-trace counters: the op's calls by choice, and the bytes this rank sent in them by choice
NORM_OPS = "sequence_parallel_norm_ops"
BYTES_SENT = "tp_comm_bytes_sent"
#: step-trace counter: a fused row-parallel layer's op calls in sequence-parallel passes (the provider's matmul +
#: reduce-scatter; where it fell back to the separate form at run time, its ``matmul_comm_fallbacks`` says why)
MATMUL_COMM_OPS = "sequence_parallel_matmul_comm"
OP = "tp_add_rms_norm"
MM_OP = "tp_matmul_reduce_scatter"
#: the report's comm form of the fused row-parallel layers (``layer_ops.sequence_parallel.matmul_comm``)
FUSED = "fused: matmul + reduce-scatter in one kernel (npu_mm_reduce_scatter_base)"


def current_pass() -> Any:
    """This forward pass's sequence-parallel record, or None (all-reduce, or outside a forward pass)."""
    if not is_forward_context_available():
        return None
    return get_forward_context().additional_kwargs.get(CONTEXT_KEY)


def tp_group() -> Any:
    """The group the op combines over (vLLM's TP group coordinator)."""
    return get_tp_group()


def step_trace() -> Any:
    """The step trace the chosen TP policy was handed for this pass (None: a dummy, profile or capture pass)."""
    kernel = kernel_mod.current_or_none()
    plan = kernel.plan if kernel is not None else None
    return getattr(plan.tp_comm, "trace", None) if plan is not None else None


def _op_impl(provider: str, partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
             eps: float, reduced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    sequence_parallel = current_pass() is not None
    ops = provider_for(provider)
    out, added, sent = combine_add_rms_norm(ops.add_rms_norm, partial, residual, weight, eps, sequence_parallel,
                                            tp_group(), reduced, getattr(ops, "add_rms_norm_in_place", None))
    trace = step_trace()
    if trace is not None:
        choice = "sequence_parallel" if sequence_parallel else "all_reduce"
        trace.count(NORM_OPS, choice)
        trace.count(BYTES_SENT, choice, sent)
    return out, added


def _op_fake(provider: str, partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
             eps: float, reduced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(partial), torch.empty_like(residual)


define_op_once(OP, "str provider, Tensor partial, Tensor residual, Tensor weight, float eps, bool reduced=False) "
               "-> (Tensor, Tensor)", _op_impl, _op_fake)


def _mm_op_impl(provider: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A fused row-parallel layer's matmul: partial sums in an all-reduce pass (the bias on rank 0, as vLLM's); in
    a sequence-parallel pass the provider's matmul + reduce-scatter, this rank's shard rows in a full-token tensor
    (zeros elsewhere: the next marked norm, ``reduced``, reads only those rows)."""
    comm = tp_group()
    world, rank, tokens = comm.world_size, comm.rank_in_group, x.shape[0]
    if current_pass() is None or world == 1:
        return F.linear(x, weight, bias if rank == 0 else None)
    padded = -(-tokens // world) * world
    shard = padded // world
    summed = provider_for(provider).matmul_reduce_scatter(x, weight, bias, comm.device_group, rank, world, padded)
    lo = rank * shard
    rows = max(min(shard, tokens - lo), 0)
    out = x.new_zeros((tokens, weight.shape[0]))
    out[lo:lo + rows] = summed[:rows]
    trace = step_trace()
    if trace is not None:
        trace.count(MATMUL_COMM_OPS, "sequence_parallel")
    return out


def _mm_op_fake(provider: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


define_op_once(MM_OP, "str provider, Tensor x, Tensor weight, Tensor? bias) -> Tensor", _mm_op_impl, _mm_op_fake)


def tp_add_rms_norm(norm: Any, partial: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A marked norm's call: one opaque op while traced (or under a dispatch mode), its body run plainly eagerly.

    ``norm.sp_handle`` (set by :func:`mark`, outside any trace) names the norm's seam provider; ``norm.sp_reduced``
    (set there too) says whether the layer before it already reduce-scattered.
    """
    handle, reduced = norm.sp_handle, norm.sp_reduced
    if is_compiling() or dispatch_mode_depth():
        return torch.ops.ascend_kernel.tp_add_rms_norm(handle, partial, residual, norm.weight, norm.variance_epsilon,
                                                       reduced)
    return _op_impl(handle, partial, residual, norm.weight.data, norm.variance_epsilon, reduced)


class AscendRowParallelLinear(RowParallelLinear):
    """vLLM's row-parallel linear; marked, it returns its partial sums (the next marked norm's op combines them)."""

    #: set by :func:`mark` on the decoder layers' output projections
    sp_shards = False
    #: set by :func:`mark` where the seam's provider fuses the matmul with the reduce-scatter (an NPU); then
    #: ``sp_handle`` names the provider
    sp_fused = False

    def forward(self, input_: torch.Tensor):
        if not self.sp_shards:
            return super().forward(input_)
        if self.input_is_parallel:
            input_parallel = input_
        else:
            input_parallel = split_tensor_along_last_dim(input_, num_partitions=self.tp_size)[self.tp_rank].contiguous()
        if self.sp_fused:  # one op: partial sums, or (a sequence-parallel pass) the fused matmul + reduce-scatter
            bias = None if self.skip_bias_add else self.bias
            if is_compiling() or dispatch_mode_depth():
                partial = torch.ops.ascend_kernel.tp_matmul_reduce_scatter(self.sp_handle, input_parallel, self.weight,
                                                                          bias)
            else:
                partial = _mm_op_impl(self.sp_handle, input_parallel, self.weight.data,
                                      None if bias is None else bias.data)
        else:
            # as vLLM's: the bias joins on rank 0 only, so that the sum over ranks adds it once
            bias = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias
            partial = self.quant_method.apply(self, input_parallel, bias)
        if not self.return_bias:
            return partial
        return partial, (self.bias if self.skip_bias_add else None)


def _is_norm(module: Any) -> bool:
    return hasattr(module, "sp_shards") and hasattr(module, "variance_epsilon")


def _moe_layers(module: torch.nn.Module) -> list[Any]:
    """The MoE layers inside a decoder layer whose final all-reduce vLLM's MoE runner would run itself.

    vLLM's runner skips that all-reduce when its config's
    ``skip_final_all_reduce`` is set (a request it reads at run time, made
    after construction); the layer's output is then the partial sum of the
    routed and shared experts, as a row-parallel layer's, for the next marked
    norm's op to combine.
    """
    found: list[Any] = []
    inside: set[int] = set()  # modules within a found MoE layer (its experts and runner parts share its config)
    for inner in module.modules():
        config = getattr(inner, "moe_config", None)
        if id(inner) in inside or config is None or not hasattr(config, "skip_final_all_reduce") or inner is module:
            continue
        inside.update(id(m) for m in inner.modules())
        if getattr(config, "is_sequence_parallel", False):
            raise RuntimeError("sequence parallelism: vLLM's own MoE sequence parallelism (use_sequence_parallel_moe) "
                               "is on as well; use one of the two")
        if config.tp_size > 1 or config.ep_size > 1:
            found.append(inner)
    return found


#: the SoCs torch_npu documents the fused matmul-collective kernels for (Atlas A2 and A3)
FUSED_SOCS = ("A2", "A3")


def unfused_reason(linears: list[Any], moe: list[Any], ops: Any, soc: str | None) -> str | None:
    """Why the marked row-parallel layers keep the separate form (matmul, then the norm's reduce-scatter); None:
    they fuse matmul and reduce-scatter, all of them.

    vllm-ascend's rule (``SequenceRowParallelOp.matmul_and_reduce``, ``mmrs_fusion``): a dense model (never an
    MoE one), TP <= 8, an unquantized (or W8A8) linear; the provider adds the kernel's documented limits. The
    choice is all or none, so every marked norm reads its input one way.
    """
    if moe:
        return "a MoE model (vllm-ascend fuses matmul and reduce-scatter in dense models only)"
    for layer in linears:
        if not isinstance(layer.quant_method, UnquantizedLinearMethod):
            return (f"{getattr(layer, 'prefix', '') or type(layer).__name__} is quantized "
                    f"({type(layer.quant_method).__name__}); the fused path is built for unquantized linears")
        reason = ops.matmul_comm_unfused_reason(layer.weight.dtype, int(layer.input_size_per_partition),
                                                int(layer.tp_size))
        if reason is not None:
            return reason
    if soc not in FUSED_SOCS:
        return f"SoC {soc}: torch_npu documents the fused kernels for Atlas {' and '.join(FUSED_SOCS)} only"
    return None


def mark(model: torch.nn.Module, soc: str | None = None) -> dict[str, Any]:
    """Mark the decoder layers' norms, row-parallel and MoE layers and the final norm; fail where the shape differs.

    A decoder layer: a module with norms ``input_layernorm`` and
    ``post_attention_layernorm``; its row-parallel layers (``o_proj``, a dense
    MLP's ``down_proj``) and MoE layers are the ones inside it, two in all.
    The final norm: ``norm`` of the module that holds the decoder layers
    (``layers``). Returns how many of each were marked (``moe`` only where
    there were MoE layers) and ``matmul_comm``: the row-parallel layers' comm form (:func:`unfused_reason`;
    ``soc``: the NPU's, None elsewhere).
    """
    counts: dict[str, Any] = {"decoder_layers": 0, "norms": 0, "row_parallel": 0}
    moe: list[Any] = []
    linears: list[Any] = []
    norms_marked: list[Any] = []
    final = None
    for module in model.modules():
        norms = [getattr(module, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
        if all(_is_norm(n) and getattr(n, "on_seam", False) for n in norms):
            counts["decoder_layers"] += 1
            for norm in norms:
                norm.sp_shards, norm.sp_handle = True, provider_handle(norm.seam_ops)
                counts["norms"] += 1
                norms_marked.append(norm)
            for inner in module.modules():
                if isinstance(inner, AscendRowParallelLinear) and inner.reduce_results and inner.tp_size > 1:
                    inner.sp_shards = True
                    counts["row_parallel"] += 1
                    linears.append(inner)
            moe += _moe_layers(module)
        if isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and _is_norm(getattr(module, "norm", None)):
            final = module.norm
    if not counts["decoder_layers"] or final is None or not getattr(final, "on_seam", False) \
            or counts["row_parallel"] + len(moe) != 2 * counts["decoder_layers"]:
        raise RuntimeError(
            f"sequence parallelism: {type(model).__name__} is not the decoder shape its layers were built for "
            f"(found {counts}, {len(moe)} MoE layers, final norm {'found' if final is not None else 'missing'}; "
            "expected two seam norms and two row-parallel or MoE layers per decoder layer, and a final seam norm); "
            "set ASCEND_KERNEL_SEQUENCE_PARALLEL=false")
    for layer in moe:
        layer.moe_config.skip_final_all_reduce = True
    if moe:
        counts["moe"] = len(moe)
    final.sp_shards, final.sp_handle = True, provider_handle(final.seam_ops)
    counts["norms"] += 1
    reason = unfused_reason(linears, moe, final.seam_ops, soc)
    if reason is None:
        for layer in linears:
            layer.sp_fused, layer.sp_handle = True, final.sp_handle
    for norm in (*norms_marked, final):  # fused layers hand on the reduced shard: their norms read it as it is
        norm.sp_reduced = reason is None
    counts["matmul_comm"] = FUSED if reason is None else f"separate: {reason}"
    return counts


def register() -> list[str]:
    """Register the sequence-parallel row-parallel linear (before the model is built)."""
    register_oot("RowParallelLinear", AscendRowParallelLinear, "set ASCEND_KERNEL_SEQUENCE_PARALLEL=false")
    return ["RowParallelLinear"]

"""Sequence parallelism's mechanism in the seam's layers (FlashComm v1), for the passes that choose it.

The TP-communication family chooses per forward pass and publishes the choice
in vLLM's forward context under ``"tp_comm"`` (a record with the pass's token
count and its padding; None: all-reduce). In a pass that chose it:

* a marked row-parallel linear (a decoder layer's ``o_proj`` and ``down_proj``)
  reduce-scatters its partial sums over the tokens instead of all-reducing
  them: each rank keeps ``padded / tp`` rows;
* a marked norm (a decoder layer's two norms, the model's final norm) adds the
  residual and normalises on that shard, the residual staying a shard (a full
  one, the first layer's embedding output, is cut to this rank's shard), and
  all-gathers its output, so the next column-parallel layer (``qkv_proj``,
  ``gate_up_proj``) and, after the final norm, the lm head see every token.

The first layer's input norm runs without a residual on the embedding's full
output, as in an all-reduce pass. Only what :func:`mark` marks changes: other
norms (Qwen3's per-head q/k norms) and row-parallel layers (a vision tower's)
keep vLLM's behaviour, as do all layers in every pass that chose all-reduce.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed import get_tp_group, split_tensor_along_last_dim
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.linear import RowParallelLinear

from ascend_kernel.ops.sequence_parallel import all_gather_tokens, reduce_scatter_tokens, token_shard
from ascend_kernel.oot_ops import register_oot

#: the forward-context key the TP-communication policy's choice is published under
CONTEXT_KEY = "tp_comm"


def current_pass() -> Any:
    """This forward pass's sequence-parallel record, or None (all-reduce, or outside a forward pass)."""
    if not is_forward_context_available():
        return None
    return get_forward_context().additional_kwargs.get(CONTEXT_KEY)


class AscendRowParallelLinear(RowParallelLinear):
    """vLLM's row-parallel linear; marked, in a sequence-parallel pass, it reduce-scatters the tokens."""

    #: set by :func:`mark` on the decoder layers' output projections
    sp_shards = False

    def forward(self, input_: torch.Tensor):
        step = current_pass() if self.sp_shards and self.reduce_results else None
        if step is None:
            return super().forward(input_)
        if self.input_is_parallel:
            input_parallel = input_
        else:
            input_parallel = split_tensor_along_last_dim(input_, num_partitions=self.tp_size)[self.tp_rank].contiguous()
        # as vLLM's: the bias joins on rank 0 only, so that the sum over ranks adds it once
        bias = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias
        partial = self.quant_method.apply(self, input_parallel, bias)
        group = get_tp_group()
        output = reduce_scatter_tokens(partial, step.padded_tokens, group.device_group, group.world_size)
        if not self.return_bias:
            return output
        return output, (self.bias if self.skip_bias_add else None)


def norm_on_shard(norm: Any, x: torch.Tensor, residual: torch.Tensor, step: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A marked norm in a sequence-parallel pass: add and normalise this rank's shard, all-gather the output.

    ``x`` is a shard (a marked row-parallel layer's output); ``residual`` is a
    shard, or the full tokens where the decoder layer kept the embedding's
    output (the first layer): then this rank's shard of it.
    """
    group = get_tp_group()
    if residual.shape[0] != x.shape[0]:
        residual = token_shard(residual, step.padded_tokens, group.rank_in_group, group.world_size)
    out, residual = norm.seam_ops.add_rms_norm(x, residual, norm.weight.data, norm.variance_epsilon)
    return all_gather_tokens(out, step.num_tokens, group.device_group, group.world_size), residual


def _is_norm(module: Any) -> bool:
    return hasattr(module, "sp_shards") and hasattr(module, "variance_epsilon")


def mark(model: torch.nn.Module) -> dict[str, int]:
    """Mark the decoder layers' norms and row-parallel layers and the final norm; fail where the shape differs.

    A decoder layer: a module with norms ``input_layernorm`` and
    ``post_attention_layernorm``; its row-parallel layers are the ones inside
    it. The final norm: ``norm`` of the module that holds the decoder layers
    (``layers``). Returns how many of each were marked.
    """
    counts = {"decoder_layers": 0, "norms": 0, "row_parallel": 0}
    final = None
    for module in model.modules():
        norms = [getattr(module, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
        if all(_is_norm(n) and getattr(n, "on_seam", False) for n in norms):
            counts["decoder_layers"] += 1
            for norm in norms:
                norm.sp_shards = True
                counts["norms"] += 1
            for inner in module.modules():
                if isinstance(inner, AscendRowParallelLinear) and inner.reduce_results:
                    inner.sp_shards = True
                    counts["row_parallel"] += 1
        if isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and _is_norm(getattr(module, "norm", None)):
            final = module.norm
    if not counts["decoder_layers"] or final is None or not getattr(final, "on_seam", False) \
            or counts["row_parallel"] != 2 * counts["decoder_layers"]:
        raise RuntimeError(
            f"sequence parallelism: {type(model).__name__} is not the dense decoder shape its layers were built for "
            f"(found {counts}, final norm {'found' if final is not None else 'missing'}; expected two seam norms and "
            "two row-parallel layers per decoder layer, and a final seam norm); set "
            "ASCEND_KERNEL_SEQUENCE_PARALLEL=false")
    final.sp_shards = True
    counts["norms"] += 1
    return counts


def register() -> list[str]:
    """Register the sequence-parallel row-parallel linear (before the model is built)."""
    register_oot("RowParallelLinear", AscendRowParallelLinear, "set ASCEND_KERNEL_SEQUENCE_PARALLEL=false")
    return ["RowParallelLinear"]

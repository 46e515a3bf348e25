"""lm-head tensor parallelism under pure data parallelism: the head and logits layers, the group, the idle rank.

Groups of N consecutive DP ranks (TP=1, so one DP group holds every rank of
the world) each share one lm head. :class:`LmHeadTpParallelLMHead` replaces
vLLM's ``ParallelLMHead``: it is vLLM's vocab-parallel embedding built over
the lm-head group instead of the TP group, so it allocates and loads only its
vocab shard (vLLM's ``weight_loader`` narrows the checkpoint's rows by the
shard's indices). :class:`LmHeadTpLogitsProcessor` replaces vLLM's
``LogitsProcessor``: for such a head its logits come from the group's
collectives (:mod:`ascend_kernel.ops.lm_head_tp`) instead of vLLM's TP
gather; soft-capping, scaling, padding removal and everything after (vLLM's
sampler and logits processors) are vLLM's, on full-vocab logits of the rank's
own tokens.

An idle DP rank runs vLLM's dummy batch, which computes no logits; the head's
collectives would wait for it. :func:`join_idle_passes` wraps the runner's
dummy batch (on that runner only) so the idle rank joins them with 0 tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn import Parameter
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    DEFAULT_VOCAB_PADDING_SIZE, ParallelLMHead, UnquantizedEmbeddingMethod, VocabParallelEmbedding,
)
from vllm.model_executor.utils import set_weight_attrs

from ascend_kernel.errors import KernelError
from ascend_kernel.oot_ops import register_oot
from ascend_kernel.ops.lm_head_tp import lm_head_tp_logits

REMEDY = "leave ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE unset"


class LmHeadGroup:
    """One lm-head group as vLLM's vocab-parallel embedding reads a group (``rank_in_group``, ``world_size``),
    with its ``torch.distributed`` group for the collectives."""

    __slots__ = ("ranks", "rank_in_group", "world_size", "device_group")

    def __init__(self, ranks: list[int], rank: int, device_group: Any) -> None:
        self.ranks = ranks
        self.rank_in_group = ranks.index(rank)
        self.world_size = len(ranks)
        self.device_group = device_group


#: the group size asked for in this process (set by :func:`register`) and the groups made, per world group
_SIZE: dict[str, int] = {"size": 1}
_GROUPS: dict[int, LmHeadGroup] = {}


def group_ranks(dp_ranks: list[int], size: int) -> list[list[int]]:
    """The lm-head groups: ``size`` consecutive DP ranks each."""
    if size < 1 or len(dp_ranks) % size:
        raise ValueError(f"lm-head group size {size} does not divide the {len(dp_ranks)} DP ranks")
    return [dp_ranks[i:i + size] for i in range(0, len(dp_ranks), size)]


def lm_head_group(size: int) -> LmHeadGroup:
    """This rank's lm-head group, made once per world group from vLLM's DP group (every rank calls it, in the
    same order: ``new_group`` is collective over the world)."""
    from vllm.distributed import get_dp_group

    world = dist.group.WORLD
    made = _GROUPS.get(id(world))
    if made is not None and made.world_size == size:
        return made
    dp = get_dp_group()
    backend = dist.get_backend(dp.device_group)
    rank = dist.get_rank()
    mine = None
    for ranks in group_ranks(list(dp.ranks), size):
        group = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            mine = LmHeadGroup(ranks, rank, group)
    if mine is None:
        raise RuntimeError(f"lm-head TP: global rank {rank} is in no group of the DP ranks {list(dp.ranks)}")
    _GROUPS.clear()
    _GROUPS[id(world)] = mine
    return mine


class LmHeadTpParallelLMHead(ParallelLMHead):
    """vLLM's ``ParallelLMHead`` sharded over the lm-head group: 1/N of the vocabulary rows on each rank."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 params_dtype: torch.dtype | None = None, org_num_embeddings: int | None = None,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE, quant_config: Any = None, prefix: str = "", *,
                 disable_tp: bool = False) -> None:
        size = _SIZE["size"]
        self.lmhead_tp = lm_head_group(size) if size > 1 and not disable_tp else None
        self.has_bias = bias
        VocabParallelEmbedding.__init__(self, num_embeddings, embedding_dim, params_dtype, org_num_embeddings,
                                        padding_size, quant_config, prefix, disable_tp=disable_tp,
                                        parallel_group=self.lmhead_tp)
        self.quant_config = quant_config
        if bias:  # as vLLM's head: one bias entry per row of this rank's shard, loaded by the same loader
            self.bias = Parameter(torch.empty(self.num_embeddings_per_partition, dtype=self.params_dtype),
                                  requires_grad=False)
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding):
        if self.lmhead_tp is not None:
            raise RuntimeError("lm-head TP: this model ties its lm head to the full embedding, which cannot be "
                               f"one vocab shard; {REMEDY}")
        return super().tie_weights(embed_tokens)


class LmHeadTpLogitsProcessor(LogitsProcessor):
    """vLLM's ``LogitsProcessor``; for a head sharded over an lm-head group, the logits come from its collectives.

    Any other head (or logits given as input) goes to vLLM's own forward. For
    the sharded head the steps after the projection are vLLM's (its forward):
    padding rows cut to the original vocabulary, soft-capping, then scaling.

    Prompt logprobs are refused (:meth:`refuse_prompt_logprobs`): vLLM's
    runner computes a request's prompt-token logits with extra
    ``compute_logits`` calls on the rank that holds the request only, each an
    lm-head collective the group's other ranks never join.
    """

    #: the runner's requests in prefill that asked for prompt logprobs (vLLM's ``num_prompt_logprobs``, a dict it
    #: updates in place), set by :func:`model_loaded`; None: no runner (a bare test)
    prompt_logprobs: dict[str, int] | None = None

    def forward(self, lm_head: VocabParallelEmbedding, hidden_states: torch.Tensor,
                embedding_bias: torch.Tensor | None = None, skip_gather: bool = False) -> torch.Tensor | None:
        group = getattr(lm_head, "lmhead_tp", None)
        if group is None or self.logits_as_input:
            return super().forward(lm_head, hidden_states, embedding_bias, skip_gather)
        self.refuse_prompt_logprobs(group)
        # at TP=1 a "local" (skip_gather) logits tensor is the full vocabulary: the same path serves both
        logits = lm_head_tp_logits(hidden_states, lambda h: self.project(lm_head, h, embedding_bias),
                                   group.device_group, group.world_size, group.rank_in_group)
        logits = logits[..., : self.org_vocab_size]
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits

    def refuse_prompt_logprobs(self, group: LmHeadGroup) -> None:
        """Stop, before any collective of the step, where a scheduled request asked for prompt logprobs."""
        if not self.prompt_logprobs:
            return
        from ascend_kernel_plugins.layers.lm_head_config import ASKED

        raise KernelError(
            f"prompt logprobs (requests {sorted(self.prompt_logprobs)}) cannot run under lm-head tensor parallelism "
            f"of size {group.world_size} (asked by {ASKED}): vLLM computes the prompt tokens' logits with extra "
            "lm-head calls on this DP rank only, collectives the group's other ranks never join (they would hang); "
            "send the request without prompt_logprobs, or leave ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE unset")

    def project(self, lm_head: VocabParallelEmbedding, hidden: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        """This rank's vocab shard of the logits: the head's quant method, or (a ``head_dtype`` other than the
        hidden states', unquantized heads only, as in vLLM) both cast to that dtype."""
        if self.head_dtype is None or self.head_dtype == hidden.dtype:
            return lm_head.quant_method.apply(lm_head, hidden, bias=bias)
        if not isinstance(lm_head.quant_method, (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
            raise ValueError("lm-head TP: a head_dtype other than the model's needs an unquantized lm head")
        return F.linear(hidden.to(self.head_dtype), lm_head.weight.to(self.head_dtype),
                        None if bias is None else bias.to(self.head_dtype))


def register(size: int) -> list[str]:
    """Set this process's group size and, for a size above 1, register the sharded head and its logits processor
    (before the model is built). Registration is permanent in a process; at size 1 the registered classes build
    vLLM's own head (over the TP group) and logits, so a later engine without lm-head TP is unchanged."""
    _SIZE["size"] = size
    _HEAD.clear()
    if size <= 1:
        return []
    register_oot("ParallelLMHead", LmHeadTpParallelLMHead, REMEDY)
    register_oot("LogitsProcessor", LmHeadTpLogitsProcessor, REMEDY)
    return ["LogitsProcessor", "ParallelLMHead"]


#: the report's ``lm_head`` object of this process's model (set when the model is loaded)
_HEAD: dict[str, int] = {}


def install(kernel: Any) -> list[str]:
    """The layer ops' install step for lm-head TP: the size from the kernel's settings, registered if asked."""
    from ascend_kernel_plugins.layers.lm_head_config import requested_size

    return register(requested_size(kernel.settings))


def model_loaded(runner: Any) -> list[str]:
    """Record the loaded head's size for the report; under lm-head TP, make idle passes join its collectives."""
    head = find_head(runner.model)
    _HEAD.clear()
    _HEAD.update(describe_head(head))
    if head is None or getattr(head, "lmhead_tp", None) is None:
        return []
    join_idle_passes(runner, head)
    for processor in runner.model.modules():
        if isinstance(processor, LmHeadTpLogitsProcessor):
            processor.prompt_logprobs = runner.num_prompt_logprobs
    return [f"lm-head TP: group ranks {head.lmhead_tp.ranks}, {_HEAD}"]


def described() -> dict[str, Any]:
    """``{"lm_head": {tp_size, vocab_per_rank, bytes}}`` for the layer ops' report (empty before a model)."""
    return {"lm_head": dict(_HEAD)} if _HEAD else {}


def find_head(model: torch.nn.Module) -> ParallelLMHead | None:
    """The model's lm head (its first ``ParallelLMHead``), or None (a pooling model)."""
    return next((m for m in model.modules() if isinstance(m, ParallelLMHead)), None)


def describe_head(head: ParallelLMHead | None) -> dict[str, int]:
    """The report's ``lm_head`` object for a built head: ``{tp_size, vocab_per_rank, bytes}`` (this rank's)."""
    if head is None:
        return {}
    weight = head.weight
    return {"tp_size": int(head.tp_size), "vocab_per_rank": int(head.num_embeddings_per_partition),
            "bytes": int(weight.numel() * weight.element_size())}


def join_idle_passes(runner: Any, head: ParallelLMHead) -> None:
    """Make the idle DP rank's dummy batch join the lm-head collectives with 0 tokens (this runner only).

    The busy ranks compute logits once per step after their forward pass; the
    idle rank's dummy batch ran the same forward pass (its MoE collectives),
    so joining right after it keeps the order of collectives the same on every rank.
    """
    dummy_batch = runner.kernel_dummy_batch
    model = runner.model

    def joined(run: Any) -> Any:
        result = dummy_batch(run)
        empty = torch.empty((0, head.embedding_dim), dtype=head.weight.dtype, device=head.weight.device)
        model.compute_logits(empty)
        return result

    runner.kernel_dummy_batch = joined

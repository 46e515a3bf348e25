"""A third-party MoE comm method, ``shard-allgather``, and a policy, ``demo-moe``, that returns it.

One file and one entry point (``ak_moe_plugin-1.0.dist-info`` beside it
declares ``[ascend_kernel.plugins] moe-demo = ak_moe_plugin``; put
``tests/thirdparty`` on ``PYTHONPATH``). Nothing in the kernel knows either name.

``shard-allgather``: ranks holding the same batch each keep one shard of it
and all-gather the shards (with their routing), so every rank sees the whole
batch whether or not it already held it; each rank runs its own experts over
all tokens and returns its partial sum for the whole batch (vLLM's TP
all-reduce adds the ranks' partials). It is correct for any layout and moves
real tokens, which is all a demo needs.

``demo-moe`` sends prefill batches to ``shard-allgather`` and decode batches
to the built-in ``alltoall``; it is chosen only when forced
(``ASCEND_KERNEL_MOE_COMM=demo-moe``), its priority being below the built-in's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

METHOD = "shard-allgather"
POLICY = "demo-moe"


class ShardAllGather:
    name = METHOD
    capacity = None
    fallback = None

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def _gather(self, t: torch.Tensor, parallel: Any, num_tokens: int) -> torch.Tensor:
        start, end = parallel.shard(num_tokens)
        if parallel.shard_count == 1:
            return t
        per_shard = -(-num_tokens // parallel.shard_count)
        mine = torch.zeros(per_shard, *t.shape[1:], dtype=t.dtype, device=t.device)
        mine[: end - start] = t[start:end]
        out = t.new_empty(parallel.shard_count * per_shard, *t.shape[1:])
        dist.all_gather_into_tensor(out, mine, group=parallel.ep_group)
        return out[:num_tokens]

    def dispatch(self, hidden, topk_weights, topk_ids, experts, parallel):
        from ascend_kernel_plugins.moe_comm.methods.base import Dispatched

        n = hidden.shape[0]
        hidden, weights = self._gather(hidden, parallel, n), self._gather(topk_weights.float(), parallel, n)
        slots = self._gather(experts.slot_of.to(topk_ids.device)[topk_ids.long()], parallel, n)
        first = parallel.ep_rank * experts.local_experts
        rows, row_idx, counts = self.ops.moe_init_routing(
            hidden, slots, parallel.ep_size * experts.local_experts, (first, first + experts.local_experts))
        return Dispatched(rows, counts, (row_idx, weights))

    def combine(self, expert_out, dispatched):
        row_idx, weights = dispatched.state
        return self.ops.moe_token_unpermute(expert_out, row_idx, weights)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "capacity": None, "fallback": None}


class DemoPolicy:
    """Prefill -> shard-allgather, decode -> alltoall, through the kernel's MethodSelector."""

    def __init__(self, ctx: Any) -> None:
        from ascend_kernel_plugins.moe_comm.selector import MethodSelector

        self.is_moe = bool(ctx.vllm_config.model_config.is_moe)
        self.selector = MethodSelector(ctx.tables.get("moe_comm_method", {}), self.decide,
                                       {METHOD, "alltoall"} if self.is_moe else set(),
                                       ctx.settings.forced("moe_comm_method"), POLICY)
        self.select = self.selector.select

    def decide(self, num_tokens: int, with_prefill: bool) -> str | None:
        if not self.is_moe:
            return None
        return METHOD if with_prefill else "alltoall"

    def prepare_model(self, vllm_config: Any) -> list[str]:
        from ascend_kernel_plugins.moe_comm import layer

        return layer.register() if self.is_moe else []

    def describe(self) -> dict[str, Any]:
        return {"methods": sorted(self.selector.table), "forced": self.selector.forced}


def _ops(ctx: Any) -> Any:
    from ascend_kernel.ops import ops_for

    return ops_for(ctx)


@hookimpl
def ascend_kernel_moe_comm_methods() -> list[Implementation]:
    return [Implementation(family="moe_comm_method", name=METHOD, factory=lambda ctx: ShardAllGather(_ops(ctx)),
                           description="token shards all-gathered; every rank runs its experts on all tokens")]


@hookimpl
def ascend_kernel_moe_comm_policies() -> list[Implementation]:
    return [Implementation(family="moe_comm", name=POLICY, factory=DemoPolicy, priority=-10,
                           description="prefill: shard-allgather (third party), decode: alltoall (built-in)")]

"""Data parallelism under compilation: every MoE layer enters through vLLM's opaque ``moe_forward`` op.

With DP > 1, vLLM's MoE runner gathers the DP ranks' tokens before the
experts and scatters the rows back after them. The row counts come from the
step's DP metadata, so the gather's shapes are data dependent: Dynamo cannot
trace them. On a GPU (and on an NPU) vLLM never tries: its runner enters the
layer through the registered op ``vllm.moe_forward`` (``moe_forward_shared``
with shared experts), whose fake only says "same shape as the input". On a
CPU platform vLLM calls the op's Python body directly (its comment: nothing
in that call graph defeats Dynamo on CPU), which is true for one DP rank and
false for several, so vLLM-CPU's default compilation failed at start-up with
DP > 1 (``KernelCpuCommunicator`` gathering a data-dependent row count).

Here, after loading and only with DP > 1, each MoE runner's entry is set to
the registered op, as vLLM's GPU platform selects it: the traced graph holds
one opaque call per MoE layer, and the gather, the experts and the scatter
run eagerly inside it each step. With one DP rank nothing changes (Dynamo
keeps tracing the experts, which inductor can fuse).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ascend_kernel.upstream import moe_runner_entry, set_moe_runner_entry


def _runners(model: Any) -> Iterator[Any]:
    """vLLM's MoE runners in ``model`` (vLLM 0.32's ``FusedMoE(...)`` builds and returns the runner module)."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    for module in model.modules():
        if isinstance(module, MoERunner):
            yield module


def opaque_entry(runner: Any) -> Any:
    """The registered op a GPU platform's runner enters through: with or without shared experts."""
    if runner.shared_experts is None:
        return torch.ops.vllm.moe_forward
    return torch.ops.vllm.moe_forward_shared


def enter_through_opaque_op(models: list[Any]) -> int:
    """Point every MoE runner of ``models`` at the registered op; returns how many runners changed."""
    changed = 0
    for model in models:
        for runner in _runners(model):
            entry = opaque_entry(runner)
            if moe_runner_entry(runner) is not entry:
                set_moe_runner_entry(runner, entry)
                changed += 1
    return changed


def needed(vllm_config: Any) -> bool:
    """Only several DP ranks gather data-dependent row counts inside the layer."""
    return int(getattr(vllm_config.parallel_config, "data_parallel_size", 1) or 1) > 1

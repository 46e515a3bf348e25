"""vLLM-CPU's communicator with the two variable-size collectives its all-to-all manager calls.

With data parallelism and expert parallelism, vLLM's MoE runner gathers the
DP ranks' tokens before each MoE layer (``all_gatherv``) and hands every rank
its own rows back after it (``reduce_scatterv``), through the all-to-all
manager vLLM-CPU installs. vLLM-CPU's communicator has neither (the base
class raises NotImplementedError), so DP + EP dies at the first request, on
stock vLLM-CPU too. Both are written here over torch.distributed (gloo on a
CPU host): the gather pads every rank's rows to the largest count and trims,
the scatter sums and slices this rank's rows. The kernel's MoE comm methods
then see the gathered batch, as every EP rank holds the same batch under TP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class KernelCpuCommunicator(CpuCommunicator):
    """CpuCommunicator plus ``all_gatherv`` / ``reduce_scatterv`` (for DP + EP MoE)."""

    def all_gatherv(self, input_: torch.Tensor | list[torch.Tensor], dim: int = 0,
                    sizes: list[int] | None = None) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(input_, (list, tuple)):
            return [self._gatherv_one(t, dim, sizes) for t in input_]
        return self._gatherv_one(input_, dim, sizes)

    def _gatherv_one(self, tensor: torch.Tensor, dim: int, sizes: list[int] | None) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        dim = dim % tensor.dim()
        if sizes is None:
            sizes = [tensor.shape[dim]] * self.world_size
        if len(sizes) != self.world_size or sizes[self.rank_in_group] != tensor.shape[dim]:
            raise ValueError(f"all_gatherv: sizes {sizes} do not fit {self.world_size} ranks with "
                             f"{tensor.shape[dim]} rows on rank {self.rank_in_group}")
        longest = max(sizes)
        padded = tensor.movedim(dim, 0)
        if padded.shape[0] < longest:
            padded = torch.cat([padded, padded.new_zeros((longest - padded.shape[0], *padded.shape[1:]))])
        blocks = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(blocks, padded.contiguous(), group=self.device_group)
        return torch.cat([block[:n] for block, n in zip(blocks, sizes)]).movedim(0, dim)

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        dim = dim % input_.dim()
        total = input_.shape[dim]
        if sizes is None:
            if total % self.world_size:
                raise ValueError(f"reduce_scatterv: {total} rows do not split evenly over {self.world_size} ranks")
            sizes = [total // self.world_size] * self.world_size
        if len(sizes) != self.world_size or sum(sizes) != total:
            raise ValueError(f"reduce_scatterv: sizes {sizes} do not add up to {total} rows over "
                             f"{self.world_size} ranks")
        summed = input_.contiguous().clone()
        dist.all_reduce(summed, group=self.device_group)
        start = sum(sizes[: self.rank_in_group])
        return summed.narrow(dim, start, sizes[self.rank_in_group]).contiguous()

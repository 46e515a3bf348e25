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


# -- checks both decoders' tests make (standard paged attention and MLA) --------------------------------------


class Piece:
    """One captured piece of a piecewise model: a pure function of its tensor inputs."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


def check_replays_equal_eager_and_oracle(full_graph: tuple, run_step: Any, check_metadata: Any) -> None:
    """Replays over :data:`STEPS` equal the oracle and the eager twin (outputs and caches); one capture, one
    update per layer per replay. ``check_metadata(metadata, lens, runner)`` checks what the builder built."""
    device, _, _, model, eager, _, runner = full_graph
    gen = torch.Generator().manual_seed(2)
    for lens in STEPS:
        x = torch.randn(len(lens), HIDDEN, generator=gen)
        replayed, reference, oracle, metadata = run_step(lens, x)
        torch.testing.assert_close(replayed[:len(lens)], oracle, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(replayed, reference, rtol=1e-5, atol=1e-5)
        for graph_cache, eager_cache in zip(model.caches, eager.caches):
            torch.testing.assert_close(graph_cache, eager_cache)
        check_metadata(metadata, lens, runner)
    assert model.calls == 1, "replays ran the recorded tasks, not the model's Python"
    assert device.graphs[0].replays == len(STEPS)
    assert device.updates == 2 * len(STEPS), "both layers' attention tasks re-issued before every replay"


def check_a_stale_replay_is_caught(full_graph: tuple, run_step: Any, op_name: str) -> None:
    """A wrapper that forgets the update before a replay is caught by the stand-in; updated again, it replays right."""
    from graph_standin import StaleTaskParamError

    from ascend_kernel_plugins.attention.ascend.graph_params import decode_graph_params
    from ascend_kernel_plugins.graph.capture_session import register_replay_preparer, unregister_replay_preparer

    device, impl, *_ = full_graph
    params = decode_graph_params(device, impl.ops)
    gen = torch.Generator().manual_seed(3)
    run_step(STEPS[0], torch.randn(3, HIDDEN, generator=gen))
    unregister_replay_preparer(device, params)
    with pytest.raises(StaleTaskParamError) as info:
        run_step(STEPS[1], torch.randn(4, HIDDEN, generator=gen))
    assert op_name in str(info.value) and "context_lens=[5, 17, 33, 1]" in str(info.value)
    assert device.graphs[0].replays == 1, "the stale replay ran nothing"
    register_replay_preparer(device, params)
    replayed, reference, oracle, _ = run_step(STEPS[1], torch.randn(4, HIDDEN, generator=gen))
    torch.testing.assert_close(replayed, oracle, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(replayed, reference, rtol=1e-5, atol=1e-5)


def check_piecewise_decode(monkeypatch: Any, device: Any, model: Any, runner: "Runner", oracle: Any,
                           pieces: int, op_name: str) -> None:
    """A piecewise model (attention eager between captured pieces) equals ``oracle(x, lens)`` over
    :data:`STEPS`: every piece replayed, no attention task recorded, nothing to update."""
    from graph_standin import capturing

    from ascend_kernel_plugins.graph.capture_session import replay_preparers

    with capturing(), forward(modes().PIECEWISE, runner.capture_step()):
        model(runner.x)
    live_decode_step(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    for lens in STEPS:
        x = torch.randn(len(lens), HIDDEN, generator=gen)
        want = oracle(x, lens)
        metadata = runner.decode_step(lens, x)
        with forward(modes().PIECEWISE, metadata):
            out = model(runner.x).clone()
        torch.testing.assert_close(out[:len(lens)], want, rtol=1e-4, atol=1e-4)
    assert len(device.graphs) == pieces and all(g.replays == len(STEPS) for g in device.graphs)
    assert not any(op_name in g.ops() or g.groups for g in device.graphs)
    assert device.updates == 0 and replay_preparers(device) == []


def full_graph_fixture(decoder: Any, make_impl: Any, weights: Any, fresh_caches: Any, make_builder: Any) -> Any:
    """A test module's ``full_graph`` fixture: its decoder captured by :func:`capture_full_graph`."""

    @pytest.fixture
    def full_graph(kernel: Any, vllm_config: Any) -> tuple:
        """The decoder captured once in a FULL ACL graph (stand-in device), plus an eager twin and the runner."""
        return capture_full_graph(decoder, make_impl(), weights(), fresh_caches, make_builder(vllm_config))

    return full_graph


def stepper(oracle: Any) -> Any:
    """A test module's ``run_step(monkeypatch, graph_parts, lens, x)``: :func:`step_both_ways` with its oracle."""
    return lambda monkeypatch, graph_parts, lens, x: step_both_ways(monkeypatch, graph_parts, lens, x, oracle)


def check_one_task_per_layer(full_graph: tuple, op: str, write: str) -> list[Any]:
    """The capture recorded one updatable ``op`` task per layer (and one cache write, ``write``), registered its
    params as the device's replay preparer, and issued them from the builder's one host buffer of lengths (vLLM
    captures with length-1 dummy requests). Returns the tasks."""
    from ascend_kernel_plugins.attention.ascend.graph_params import decode_graph_params
    from ascend_kernel_plugins.graph.capture_session import replay_preparers

    device, impl, _, model, _, _, runner = full_graph
    (graph,) = device.graphs
    assert model.calls == 1 and graph.captured
    assert graph.ops().count(op) == 2
    assert graph.ops().count("ascend_kernel::reshape_and_cache") == 2, f"the {write} is one task per layer"
    assert [[t.op._schema.name for t in graph.tasks[g.start:g.end]] for g in graph.groups] == [[op]] * 2
    params = decode_graph_params(device, impl.ops)
    assert replay_preparers(device) == [params]
    tasks = params.tasks[graph]
    assert [t.layer_name for t in tasks] == list(LAYERS)
    assert runner.builder.host_lengths.buffer[:N].tolist() == [1] * N
    assert all(t.seq_lens.data_ptr() == runner.builder.host_lengths.buffer.data_ptr() for t in tasks)
    return tasks


class CountingDecoder:
    """Two decoder layers over the real impl; counts its Python calls (a replay must run none of them).

    A test module's subclass says what one layer does: ``layer(name, w, cache, meta, h) -> h``.
    """

    def __init__(self, impl: Any, w: Any, caches: list[torch.Tensor]) -> None:
        self.impl, self.w, self.caches, self.calls = impl, w, caches, 0

    def layer(self, name: str, w: dict[str, torch.Tensor], cache: torch.Tensor, meta: Any,
              h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        self.calls += 1
        metadata = get_forward_context().attn_metadata
        h = x
        for name, w, cache in zip(LAYERS, self.w, self.caches):
            h = self.layer(name, w, cache, metadata[name], h)
        return h

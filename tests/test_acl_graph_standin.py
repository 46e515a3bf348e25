"""ACL graph mode on the device seam, checked with a recording stand-in for torch.npu's graphs.

The wrapper (``AclGraphWrapper``) and the FULL_DECODE_ONLY attention updates
(``DecodeGraphParams``) are driven as vLLM and the runner would drive them:
a forward context carrying the runtime mode and batch descriptor, capture only
while capturing is enabled. The graphs come from ``tests/graph_standin.py``
(injected as the device; no mocks), which replays recorded tasks. Oracles are
computed independently: eager torch with the current inputs, and a naive
attention over the paged cache. None of this has run on an NPU.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from graph_standin import (CaptureError, RecordingGraphDevice, StaleTaskParamError, StandinGraph, TaskUpdateError,
                            capturing)

from ascend_kernel.ops.reference import ReferenceOps
from ascend_kernel_plugins.attention.ascend.graph_params import DecodeGraphParams
from ascend_kernel_plugins.graph.acl_wrapper import AclGraphWrapper, MovedInputError


@contextlib.contextmanager
def forward(mode, num_tokens):
    """The forward context vLLM's runner publishes for one pass."""
    from vllm.forward_context import BatchDescriptor, ForwardContext, override_forward_context

    ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={}, cudagraph_runtime_mode=mode,
                         batch_descriptor=BatchDescriptor(num_tokens=num_tokens))
    with override_forward_context(ctx):
        yield


def modes():
    from vllm.config.compilation import CUDAGraphMode

    return CUDAGraphMode


class Counted:
    """A runnable that counts its Python calls (a replay must not make any)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, x, w):
        self.calls += 1
        return self.fn(x, w)


def mlp(x, w):
    h = (x @ w).relu()
    return h + 1, h.view(-1)


# -- the wrapper --------------------------------------------------------------------


def test_capture_then_replay_equals_eager():
    device = RecordingGraphDevice()
    runnable = Counted(mlp)
    wrapper = AclGraphWrapper(runnable, None, modes().PIECEWISE, device=device)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with capturing(), forward(modes().PIECEWISE, 4):
        captured, captured_view = wrapper(x, w)
    graph = device.graphs[0]
    assert runnable.calls == 1 and graph.captured
    assert {"aten::mm", "aten::relu", "aten::add"} <= set(graph.ops())

    for step in range(3):  # the runner writes each step's inputs in place
        x.copy_(torch.randn(4, 8))
        w.mul_(0.5)
        with forward(modes().PIECEWISE, 4):
            out, view = wrapper(x, w)
        want = (x.clone() @ w.clone()).relu()
        torch.testing.assert_close(out, want + 1)
        torch.testing.assert_close(view, want.view(-1))
        assert out.data_ptr() == captured.data_ptr(), "outputs live in the capture's buffers"
    assert runnable.calls == 1, "a replay runs the recorded tasks, not the Python"
    assert graph.replays == 3


def test_moved_input_is_named():
    device = RecordingGraphDevice()
    wrapper = AclGraphWrapper(mlp, None, modes().PIECEWISE, device=device)
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    with capturing(), forward(modes().PIECEWISE, 2):
        wrapper(x, w)
    with forward(modes().PIECEWISE, 2), pytest.raises(MovedInputError) as info:
        wrapper(x, w.clone())
    assert "input 1 (w) moved" in str(info.value) and "in place" in str(info.value)
    assert device.graphs[0].replays == 0


def test_mode_mismatch_runs_the_plain_runnable():
    device = RecordingGraphDevice()
    runnable = Counted(mlp)
    wrapper = AclGraphWrapper(runnable, None, modes().FULL, device=device)
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    with capturing():
        for mode in (modes().NONE, modes().PIECEWISE):
            with forward(mode, 2):
                out, _ = wrapper(x, w)
            torch.testing.assert_close(out, (x @ w).relu() + 1)
        wrapper(x, w)  # no forward context at all (e.g. an encoder pass)
    assert runnable.calls == 3 and device.graphs == [] and wrapper.entries == {}


def test_graphs_and_pool_come_from_the_device_seam():
    device = RecordingGraphDevice()
    a = AclGraphWrapper(mlp, None, modes().PIECEWISE, device=device)
    b = AclGraphWrapper(mlp, None, modes().PIECEWISE, device=device)
    assert a.graph_pool is b.graph_pool and device.pools == [a.graph_pool], "one pool per device, shared"
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    with capturing():
        for n in (1, 2):
            with forward(modes().PIECEWISE, n):
                a(x[:n], w)
    assert len(device.graphs) == 2 and all(isinstance(g, StandinGraph) for g in device.graphs)
    assert all(g.pool is a.graph_pool and g.stream == device.current_stream() for g in device.graphs)
    assert {e.graph for e in a.entries.values()} == set(device.graphs)


def test_capture_outside_the_capture_loop_is_refused():
    wrapper = AclGraphWrapper(mlp, None, modes().PIECEWISE, device=RecordingGraphDevice())
    with forward(modes().PIECEWISE, 2), pytest.raises(RuntimeError, match="(?i)captur"):
        wrapper(torch.randn(2, 8), torch.randn(8, 8))


def test_host_read_inside_capture_fails_like_a_device_graph():
    wrapper = AclGraphWrapper(lambda x, w: x * float((x @ w).sum()), None, modes().FULL,
                              device=RecordingGraphDevice())
    with capturing(), forward(modes().FULL, 2), pytest.raises(CaptureError, match="host"):
        wrapper(torch.randn(2, 8), torch.randn(8, 8))


def test_aclgraph_mode_names_this_wrapper():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from ascend_kernel_plugins.graph.modes import AclGraphMode

    assert resolve_obj_by_qualname(AclGraphMode([1, 2]).static_graph_wrapper_cls()) is AclGraphWrapper


def test_device_seam_refuses_graph_work_without_a_device_graph():
    from ascend_kernel.device import Device, GraphTaskGroup

    cpu = Device("cpu")
    for call in (cpu.graph_pool_handle, lambda: cpu.graph_capture(None), lambda: cpu.new_graph()):
        with pytest.raises(RuntimeError, match="runs on cpu"):
            call()
    with pytest.raises(RuntimeError, match="needs an NPU; this kernel runs on cpu"):
        with cpu.graph_task_update(GraphTaskGroup(), None):
            pass


# -- FULL_DECODE_ONLY: attention tasks updated with the batch's sequence lengths ----------


H, KVH, D, BLOCK, BLOCKS, N = 4, 2, 16, 16, 12, 3


class Decode:
    """A whole decode step captured as one graph: q projection, paged attention, output projection."""

    def __init__(self, params: DecodeGraphParams | None, ops: ReferenceOps) -> None:
        g = torch.Generator().manual_seed(0)
        self.wq = torch.randn(H * D, H * D, generator=g) / D
        self.wo = torch.randn(H * D, H * D, generator=g) / D
        self.key_cache = torch.randn(BLOCKS, BLOCK, KVH, D, generator=g)
        self.value_cache = torch.randn(BLOCKS, BLOCK, KVH, D, generator=g)
        self.block_table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32)
        self.seq_lens = torch.tensor([5, 17, 33], dtype=torch.int32)  # the runner's persistent host buffer
        self.params, self.ops = params, ops
        self.scale = 1 / math.sqrt(D)

    def __call__(self, x, w_unused=None):
        q = (x @ self.wq).view(N, H, D)
        args = (q, self.key_cache, self.value_cache, self.block_table, self.seq_lens, self.scale, H, KVH)
        if self.params is None:  # eager: the functional op
            attn = self.ops.paged_attention(*args)
        else:
            attn = self.params.paged_attention(N, *args, out=torch.empty_like(q))
        return attn.reshape(N, H * D) @ self.wo


def naive_decode(step: Decode, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
    """Independent oracle: gather each request's cached K/V by block table, softmax attention, projections."""
    q = (x @ step.wq).view(N, H, D)
    rows = []
    for i, length in enumerate(seq_lens):
        slots = [int(step.block_table[i, t // BLOCK]) * BLOCK + t % BLOCK for t in range(length)]
        k = step.key_cache.view(-1, KVH, D)[slots].repeat_interleave(H // KVH, dim=1)  # [L, H, D]
        v = step.value_cache.view(-1, KVH, D)[slots].repeat_interleave(H // KVH, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i], k) * step.scale
        rows.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v).reshape(-1))
    return torch.stack(rows) @ step.wo


@pytest.fixture
def decode_graph():
    device, ops = RecordingGraphDevice(), ReferenceOps()
    params = DecodeGraphParams(device, ops)
    step = Decode(params, ops)
    wrapper = AclGraphWrapper(step, None, modes().FULL, device=device)
    x = torch.randn(N, H * D)
    with capturing(), forward(modes().FULL, N):
        captured = wrapper(x)
    torch.testing.assert_close(captured, naive_decode(step, x, [5, 17, 33]))
    return device, params, step, wrapper, x, captured


def replay(wrapper, x):
    with forward(modes().FULL, N):
        return wrapper(x)


def test_decode_graph_records_one_attention_task_group_per_call(decode_graph):
    device, params, step, _, _, _ = decode_graph
    graph = device.graphs[0]
    assert graph.ops().count("ascend_kernel::paged_attention_out") == 1
    (task,) = params.tasks[N]
    handle = task.group.handle
    assert [t.op._schema.name for t in graph.tasks[handle.start:handle.end]] == ["ascend_kernel::paged_attention_out"]
    assert task.seq_lens is step.seq_lens


def test_replay_after_updating_seq_lens_equals_eager_decode(decode_graph):
    device, params, step, wrapper, x, captured = decode_graph
    eager = Decode(None, ReferenceOps())
    for new_lens in ([6, 18, 34], [7, 30, 64], [7, 30, 64]):
        step.seq_lens.copy_(torch.tensor(new_lens))  # next decode step, written in place
        x.copy_(torch.randn(N, H * D))
        assert params.update(N, step.seq_lens) == 1
        out = replay(wrapper, x)
        eager.seq_lens.copy_(step.seq_lens)
        torch.testing.assert_close(out, eager(x.clone()))
        torch.testing.assert_close(out, naive_decode(step, x, new_lens))
        assert out.data_ptr() == captured.data_ptr()
    assert device.updates == 3 and device.graphs[0].replays == 3


def test_replay_without_update_fails_on_stale_seq_lens(decode_graph):
    _, _, step, wrapper, x, _ = decode_graph
    replay(wrapper, x)  # unchanged lengths: the captured task is still right
    step.seq_lens.add_(1)
    with pytest.raises(StaleTaskParamError) as info:
        replay(wrapper, x)
    text = str(info.value)
    assert "paged_attention_out" in text and "context_lens=[5, 17, 33]" in text and "[6, 18, 34]" in text
    assert "graph_task_update" in text


def test_update_must_re_issue_the_same_ops(decode_graph):
    device, params, step, _, x, _ = decode_graph
    (task,) = params.tasks[N]
    with pytest.raises(TaskUpdateError, match="re-issue the group's ops"):
        with device.graph_task_update(task.group, params.update_stream):
            pass
    with pytest.raises(ValueError, match="pad the batch"):
        params.update(N, step.seq_lens[:2])

"""Sequence parallelism's fused row-parallel path on the stand-in NPU: two TP ranks, fused against separate.

A row-parallel layer marked fused runs ``ascend_kernel::tp_matmul_reduce_scatter``
(the provider's ``npu_mm_reduce_scatter_base`` in a sequence-parallel pass)
and the next norm reads the reduced shard (``reduced``); the separate form is
what a CPU host runs (partial sums, the norm's reduce-scatter). Both, per
pass choice, must give every token the float64 result of the full layer
(matmul over all the ranks' columns, + residual, RMSNorm). Which layers fuse
is :func:`unfused_reason` (vllm-ascend's rule plus the kernel's limits).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ascend_kernel.ops.sequence_parallel import _all_gather, _reduce_scatter
from npu import fake_torch_npu
from npu.standin import host, npu
from npu.standin_hccl import Fabric, run_ranks

WORLD, K, HIDDEN, EPS = 2, 512, 16, 1e-6


class _Comm:
    """vLLM's TP group coordinator as the norm's op reads it, over one rank's stand-in HCCL group."""

    def __init__(self, group, rank: int) -> None:
        self.device_group, self.rank_in_group, self.world_size = group, rank, WORLD
        self.calls: list[str] = []  # the norm's own collectives, in order

    def all_reduce(self, x):
        self.calls.append("all_reduce")
        x = x.clone()
        dist.all_reduce(x, group=self.device_group)
        return x

    def reduce_scatter(self, x, dim=0):
        self.calls.append("reduce_scatter")
        out = x.new_empty((x.shape[0] // WORLD, *x.shape[1:]))
        _reduce_scatter(out, x.contiguous(), group=self.device_group)
        return out

    def all_gather(self, x, dim=0):
        self.calls.append("all_gather")
        out = x.new_empty((x.shape[0] * WORLD, *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=self.device_group)
        return out


@pytest.fixture
def sp_ranks(npu_ops, monkeypatch):
    """The layer module with the forward context, TP group and step trace of the calling rank's thread."""
    from ascend_kernel.ops.opaque import provider_handle
    from ascend_kernel.step import StepTrace
    from ascend_kernel_plugins.layers import sequence_parallel as sp

    class Provider(type(npu_ops)):  # the torch_npu provider; its add + RMSNorm in plain torch (the fake has none)
        name = "sp-fused-test"

        def add_rms_norm(self, x, residual, weight, eps):
            added = (x.float() + residual.float())
            normed = added * torch.rsqrt(added.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
            return normed.to(x.dtype), added.to(x.dtype)

    local = threading.local()
    monkeypatch.setattr(sp, "current_pass", lambda: local.record)
    monkeypatch.setattr(sp, "tp_group", lambda: local.comm)
    monkeypatch.setattr(sp, "step_trace", lambda: local.trace)
    provider = Provider()
    return SimpleNamespace(sp=sp, local=local, provider=provider, handle=provider_handle(provider),
                           trace=StepTrace)


@pytest.mark.parametrize("tokens", [5, 4, 1])
def test_fused_and_separate_forms_give_every_token_the_full_layer(sp_ranks, tokens):
    from ascend_kernel_plugins.tp_comm.policy import SequenceParallelPass

    g = torch.Generator().manual_seed(tokens)
    x = (torch.randn(tokens, K, generator=g) / 8).to(torch.bfloat16)
    w = (torch.randn(HIDDEN, K, generator=g) / 8).to(torch.bfloat16)
    bias = torch.randn(HIDDEN, generator=g).to(torch.bfloat16)
    residual = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
    norm_w = (1 + torch.arange(HIDDEN) / 10).to(torch.bfloat16)
    sp, local, handle = sp_ranks.sp, sp_ranks.local, sp_ranks.handle
    fabric = Fabric(WORLD)

    def rank(r: int) -> dict:
        local.comm, local.trace = _Comm(groups[r], r), sp_ranks.trace()
        cols = slice(r * K // WORLD, (r + 1) * K // WORLD)
        xr, wr = npu(x[:, cols]), npu(w[:, cols])
        got = {}
        for choice in ("all_reduce", "sequence_parallel"):
            local.record = None if choice == "all_reduce" else SequenceParallelPass.of(tokens, WORLD)
            fused = sp._mm_op_impl(handle, xr, wr, npu(bias))
            local.comm.calls.clear()
            got[choice, "fused"] = [host(t) for t in sp._op_impl(handle, fused, npu(residual), npu(norm_w), EPS,
                                                                 True)]
            got[choice, "fused", "norm_collectives"] = list(local.comm.calls)
            partial = F.linear(xr, wr, npu(bias) if r == 0 else None)  # the separate form: vLLM's partial sums
            local.comm.calls.clear()
            got[choice, "separate"] = [host(t) for t in sp._op_impl(handle, partial, npu(residual), npu(norm_w),
                                                                    EPS, False)]
            got[choice, "separate", "norm_collectives"] = list(local.comm.calls)
        got["trace"] = local.trace.as_dict()
        return got

    with fabric.groups() as groups:
        outs = run_ranks(WORLD, rank)
    added = x.double() @ w.double().T + bias.double() + residual.double()
    want = added * torch.rsqrt(added.pow(2).mean(-1, keepdim=True) + EPS) * norm_w.double()
    shard = SequenceParallelPass.of(tokens, WORLD).shard_tokens
    for r, got in enumerate(outs):
        rows = slice(r * shard, min((r + 1) * shard, tokens))
        for key in (("all_reduce", "fused"), ("all_reduce", "separate"), ("sequence_parallel", "fused"),
                    ("sequence_parallel", "separate")):
            normed, res = got[key]
            assert normed.shape == (tokens, HIDDEN)
            torch.testing.assert_close(normed.double(), want, rtol=3e-2, atol=3e-2)
            torch.testing.assert_close(res[rows].double(), added[rows], rtol=3e-2, atol=3e-2)
        # the fused layer reduce-scattered inside its kernel: the norm only all-gathers (all-reduce passes: as before)
        assert got["sequence_parallel", "fused", "norm_collectives"] == ["all_gather"]
        assert got["sequence_parallel", "separate", "norm_collectives"] == ["reduce_scatter", "all_gather"]
        assert got["all_reduce", "fused", "norm_collectives"] == got["all_reduce", "separate", "norm_collectives"] \
            == ["all_reduce"]
        assert got["trace"]["sequence_parallel_matmul_comm"] == {"sequence_parallel": 1}  # the sequence-parallel pass only
        assert got["trace"]["sequence_parallel_norm_ops"] == {"all_reduce": 2, "sequence_parallel": 2}
    fused_calls = [c for c in fake_torch_npu.CALLS if c[0] == "npu_mm_reduce_scatter_base"]
    assert len(fused_calls) == WORLD and fused_calls[0][1][0].shape[0] == SequenceParallelPass.of(tokens,
                                                                                                   WORLD).padded_tokens


def _linear(quant_method=None, in_features=1024, dtype=torch.bfloat16, tp=2):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    return SimpleNamespace(quant_method=quant_method or UnquantizedLinearMethod(), weight=torch.empty(0, dtype=dtype),
                           input_size_per_partition=in_features, tp_size=tp, prefix="model.layers.0.self_attn.o_proj")


def test_which_layers_fuse(npu_ops):
    from ascend_kernel.ops.matmul_comm import REFERENCE_REASON
    from ascend_kernel.ops.reference import ReferenceOps
    from ascend_kernel_plugins.layers.sequence_parallel import unfused_reason

    assert unfused_reason([_linear(), _linear(in_features=4096)], [], npu_ops, "A2") is None
    assert unfused_reason([_linear()], [], npu_ops, "A3") is None
    assert unfused_reason([_linear()], [], ReferenceOps(), None) == REFERENCE_REASON  # a CPU host: as before
    assert unfused_reason([_linear()], [object()], npu_ops, "A2").startswith("a MoE model")
    assert "is quantized (object)" in unfused_reason([_linear(quant_method=object())], [], npu_ops, "A2")
    assert unfused_reason([_linear(), _linear(in_features=128)], [], npu_ops, "A2").startswith("128 input features")
    assert unfused_reason([_linear(tp=16)], [], npu_ops, "A3").startswith("TP size 16")
    assert unfused_reason([_linear(dtype=torch.float32)], [], npu_ops, "A2").startswith("activations torch.float32")
    assert unfused_reason([_linear()], [], npu_ops, "310P").startswith("SoC 310P")


def test_the_fused_layer_op_traces_opaque_and_gives_partial_sums_in_an_all_reduce_pass(monkeypatch):
    """Compiled (fullgraph) the layer's op is one opaque call whose fake has the pass's full token count; run in an
    all-reduce pass it is the partial sum of this rank (the bias on rank 0 only, as vLLM's row-parallel linear)."""
    from ascend_kernel.ops.opaque import provider_handle
    from ascend_kernel.ops.reference import ReferenceOps
    from ascend_kernel_plugins.layers import sequence_parallel as sp

    handle = provider_handle(ReferenceOps())
    monkeypatch.setattr(sp, "current_pass", lambda: None)
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(5, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, generator=g))

    def layer(x, w, b):
        return torch.ops.ascend_kernel.tp_matmul_reduce_scatter(handle, x * 1.0, w, b) * 2.0

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for rank, bias in ((0, b), (1, None)):
        monkeypatch.setattr(sp, "tp_group", lambda: SimpleNamespace(world_size=WORLD, rank_in_group=rank))
        torch.testing.assert_close(compiled(x, w, b), 2 * F.linear(x, w, bias))

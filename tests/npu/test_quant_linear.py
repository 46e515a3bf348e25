"""The int8 linear layer's NPU path (load and forward) on the stand-in device, against a float64 oracle.

The oracle is the NPU formula written here in numpy from the checkpoint's
quantities (msModelSlim's static W8A8, compressed-tensors' symmetric static,
W8A8_DYNAMIC); nothing of the loader is reused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu import fake_torch_npu
from npu.standin import DEVICE, host, npu


def _weights(static: bool, zero_point: bool, seed: int = 0, n: int = 24, k: int = 32):
    from ascend_kernel_plugins.quantization.int8_linear import Int8Weights

    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    weight_scale = torch.rand(n, generator=g) * 2e-3 + 1e-4
    if not static:
        return Int8Weights(npu(weight), npu(weight_scale), None, None)
    input_scale = torch.tensor([0.03])
    zp = npu(torch.tensor([-5.0])) if zero_point else None
    codes = torch.randint(-300, 300, (n,), generator=g, dtype=torch.int64)
    return Int8Weights(npu(weight), npu(weight_scale), npu(input_scale), zp,
                       deq_scale=npu(input_scale * weight_scale), bias_codes=npu(codes))


def _oracle(w, x: torch.Tensor) -> np.ndarray:
    xs = x.double().numpy()
    wt = host(w.weight).numpy().astype(np.int64).T
    if w.input_scale is None:
        scale = np.abs(xs).max(axis=1) / 127
        xq = np.clip(np.rint(xs / scale[:, None]), -128, 127).astype(np.int64)
        return (xq @ wt) * host(w.weight_scale).double().numpy() * scale[:, None]
    zp = float(host(w.zero_point)) if w.zero_point is not None else 0.0
    xq = np.clip(np.rint(xs / float(host(w.input_scale)) + zp), -128, 127).astype(np.int64)
    return ((xq - zp) @ wt + host(w.bias_codes).numpy()) * host(w.deq_scale).double().numpy()


@pytest.mark.parametrize("static,zero_point", [(False, False), (True, True), (True, False)],
                         ids=["W8A8_DYNAMIC", "W8A8-msmodelslim", "W8A8-symmetric-no-zero-point"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_linear_runs_on_the_device(npu_ops, static, zero_point, dtype):
    """Bug 2 of issue 41: a symmetric static layer made its zero point on the CPU (fails here at build)."""
    from ascend_kernel_plugins.quantization.int8_linear import SeamInt8Executor

    w = _weights(static, zero_point)
    executor = SeamInt8Executor(w, npu_ops)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = executor(npu(x), None)
    assert out.device == DEVICE and out.dtype == dtype
    want = _oracle(w, x.float())
    np.testing.assert_allclose(host(out).double().numpy(), want, rtol=2e-2, atol=1e-2 * np.abs(want).max())
    names = [c[0] for c in fake_torch_npu.CALLS]
    assert names[0] == "npu_format_cast" and fake_torch_npu.CALLS[0][1][1] == 29  # the weight in FRACTAL_NZ
    assert ("npu_quantize" in names) == static and ("npu_dynamic_quant" in names) == (not static)
    if static and dtype == torch.float16:  # float16 output without a per-token scale takes the packed scale
        assert "npu_trans_quant_param" in names


def test_row_parallel_sums_use_the_gloo_group_with_host_tensors(npu_ops, monkeypatch):
    """Bug 1: the row sums of a row-parallel static layer were all-reduced on gloo as device tensors.

    Two TP ranks (threads of this process) on a real two-rank gloo group (torch's ``ProcessGroupGloo`` over an
    in-memory store), each holding its own shard of the input dimension: both get the whole weight's row sums,
    on the device. Gloo itself refuses a device tensor (as it would an NPU one), so the sums must cross on the
    host."""
    import threading

    import torch.distributed as dist
    import vllm.distributed
    from vllm.model_executor.layers.linear import RowParallelLinear

    from ascend_kernel_plugins.quantization.int8_linear import full_row_sums

    from npu.standin_hccl import run_ranks

    weight = torch.randint(-127, 128, (6, 10), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    store, mine = dist.HashStore(), threading.local()
    monkeypatch.setattr(vllm.distributed, "get_tp_group", lambda: mine.tp)

    def rank(r: int):
        mine.tp = type("TP", (), {"cpu_group": dist.ProcessGroupGloo(store, r, 2)})()
        layer = RowParallelLinear.__new__(RowParallelLinear)
        object.__setattr__(layer, "tp_size", 2)
        sums = full_row_sums(layer, npu(weight[:, r * 5:(r + 1) * 5]))
        with pytest.raises(RuntimeError, match="unsupported device type npu"):
            dist.all_reduce(npu(torch.ones(2, dtype=torch.int64)), group=mine.tp.cpu_group)
        return sums

    for sums in run_ranks(2, rank):
        assert sums.device == DEVICE
        assert torch.equal(host(sums), weight.to(torch.int64).sum(dim=1))


def test_the_standin_refuses_a_collective_on_device_tensors():
    """The stand-in itself: a c10d op over npu tensors fails (it would need the device group's HCCL)."""
    with pytest.raises(RuntimeError, match="collective over device"):
        torch.ops._c10d_functional.all_reduce(npu(torch.ones(3)), "sum", "0")


def test_a_cpu_tensor_among_device_tensors_fails():
    with pytest.raises(RuntimeError, match="CPU tensor"):
        npu(torch.ones(3)) * torch.zeros(1)
    assert (npu(torch.ones(3)) * torch.tensor(2.0)).device == DEVICE  # a 0-dim CPU scalar is allowed, as on CUDA

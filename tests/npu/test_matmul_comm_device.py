"""The torch_npu provider's fused matmul + reduce-scatter / all-gather + matmul on the stand-in NPU, two TP ranks.

Two in-process ranks of a stand-in HCCL group (:mod:`npu.standin_hccl`) call
the provider; the fake torch_npu's kernels (written from the docs) exchange
the ranks' products through the group's communicator name. Each result is
checked against a float64 oracle (one full matmul over every rank's columns)
and against the separate form (the reference: matmul, then the group's HCCL
collective), which the provider runs where the kernels do not apply.
"""

from __future__ import annotations

import pytest
import torch

from npu import fake_torch_npu
from npu.standin import DEVICE, host, npu
from npu.standin_hccl import Fabric, run_ranks

WORLD, TOKENS, N = 2, 5, 16
PADDED = 6


def _data(k: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return {"x": (torch.randn(TOKENS, k, generator=g) / 4).to(dtype),
            "w": (torch.randn(N, k, generator=g) / 4).to(dtype), "b": torch.randn(N, generator=g).to(dtype)}


def _row_parallel(npu_ops, d: dict[str, torch.Tensor], k: int, bias: bool) -> list[torch.Tensor]:
    fabric = Fabric(WORLD)

    def rank(r: int) -> torch.Tensor:
        cols = slice(r * k // WORLD, (r + 1) * k // WORLD)
        out = npu_ops.matmul_reduce_scatter(npu(d["x"][:, cols]), npu(d["w"][:, cols]), npu(d["b"]) if bias else None,
                                            groups[r], r, WORLD, PADDED)
        assert out.device == DEVICE
        return host(out)

    with fabric.groups() as groups:
        return run_ranks(WORLD, rank)


def _oracle_rows(d: dict[str, torch.Tensor], bias: bool) -> torch.Tensor:
    full = torch.zeros(PADDED, N, dtype=torch.float64)
    full[:TOKENS] = d["x"].double() @ d["w"].double().T
    return full + (d["b"].double() if bias else 0)


@pytest.mark.parametrize("bias", [False, True])
def test_matmul_reduce_scatter_is_fused_where_the_kernel_applies(npu_ops, bias):
    k = 512  # 256 input features per rank: the kernel's smallest k
    d = _data(k, torch.bfloat16)
    outs = _row_parallel(npu_ops, d, k, bias)
    want = _oracle_rows(d, bias)
    for r, out in enumerate(outs):
        rows = PADDED // WORLD
        torch.testing.assert_close(out.double(), want[r * rows:(r + 1) * rows], rtol=2e-2, atol=2e-2)
    calls = [c for c in fake_torch_npu.CALLS if c[0] == "npu_mm_reduce_scatter_base"]
    assert len(calls) == WORLD and not npu_ops.matmul_comm_fallbacks
    (x1, x2, hcom, world), kwargs = calls[0][1], calls[0][2]
    assert x1.shape == (PADDED, k // WORLD) and x2.shape == (k // WORLD, N)  # padded rows; vLLM's weight, transposed
    assert hcom.startswith("standin_hccl_") and world == WORLD
    assert kwargs == {"reduce_op": "sum", "bias": None, "comm_turn": 0}  # the bias joins after the kernel


@pytest.mark.parametrize("k, dtype, why", [(128, torch.bfloat16, "64 input features per rank"),
                                           (512, torch.float32, "activations torch.float32")])
def test_matmul_reduce_scatter_falls_back_to_the_separate_form_with_the_reason(npu_ops, k, dtype, why):
    d = _data(k, dtype)
    outs = _row_parallel(npu_ops, d, k, True)
    want, rows = _oracle_rows(d, True), PADDED // WORLD
    for r, out in enumerate(outs):
        torch.testing.assert_close(out.double(), want[r * rows:(r + 1) * rows], rtol=2e-2, atol=2e-2)
    assert not [c for c in fake_torch_npu.CALLS if c[0] == "npu_mm_reduce_scatter_base"]
    (reason, count), = npu_ops.matmul_comm_fallbacks.items()
    assert reason.startswith(why) and count == WORLD


def test_fused_and_separate_forms_agree(npu_ops):
    """The same layer both ways: the fused kernel (bf16, k 256 per rank) against the reference's matmul and
    HCCL reduce-scatter over the same stand-in group (the float32 copy of the same values)."""
    d = _data(512, torch.bfloat16)
    fused = _row_parallel(npu_ops, d, 512, True)
    separate = _row_parallel(npu_ops, {n: t.float() for n, t in d.items()}, 512, True)
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("k, fused", [(256, True), (64, False)])
def test_all_gather_matmul_gives_every_rank_every_token(npu_ops, k, fused):
    d = _data(k, torch.bfloat16)
    fabric = Fabric(WORLD)
    rows = PADDED // WORLD
    x = torch.zeros(PADDED, k, dtype=torch.bfloat16)
    x[:TOKENS] = d["x"]

    def rank(r: int) -> torch.Tensor:
        return host(npu_ops.all_gather_matmul(npu(x[r * rows:(r + 1) * rows]), npu(d["w"]), npu(d["b"]), groups[r],
                                              r, WORLD, TOKENS))

    with fabric.groups() as groups:
        outs = run_ranks(WORLD, rank)
    want = d["x"].double() @ d["w"].double().T + d["b"].double()
    for out in outs:
        assert out.shape == (TOKENS, N)
        torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    calls = [c for c in fake_torch_npu.CALLS if c[0] == "npu_all_gather_base_mm"]
    assert len(calls) == (WORLD if fused else 0) and bool(npu_ops.matmul_comm_fallbacks) is not fused
    if fused:
        assert calls[0][2] == {"bias": None, "gather_index": 0, "gather_output": False, "comm_turn": 0}

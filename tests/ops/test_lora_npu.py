"""The torch_npu provider's LoRA ops meet the seam's contracts, given kernels that behave as vLLM-Ascend documents.

No NPU here: ``torch.ops._C_ascend`` is stood in for by CPU ops registered
under vLLM-Ascend's schemas, doing what its kernels do and refusing what they
refuse (a shrink reads ``x`` and the weights in one half-precision dtype and
writes float32; an expand reads ``x`` as float32 and always adds; rows with a
negative index are skipped, tokens past the groups too). Under test is the
provider's adaptation (dtype buffers, zeroed shrink rows, ``add_inputs=False``,
weights cut to the slice), checked against the reference provider.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernel.ops import get_ops
from ascend_kernel.ops.lora_npu import TorchNpuLoRAOps
from ascend_kernel.ops.lora_reference import token_indices

HALF = (torch.float16, torch.bfloat16)


def _rows(indices: torch.Tensor) -> list[tuple[int, int]]:
    assert indices.dtype == torch.int64, "the kernels read int64 indices"
    return [(t, int(i)) for t, i in enumerate(indices.tolist()) if i >= 0]


def _shrink(x, weight, indices, y, scale):
    assert x.dtype in HALF and weight.dtype == x.dtype and y.dtype == torch.float32, (x.dtype, weight.dtype, y.dtype)
    w = weight.reshape(weight.shape[0], -1, weight.shape[-1]).float()
    for t, slot in _rows(indices):
        y[t] = scale * (w[slot] @ x[t].float())


def _expand(x, weight, indices, y, offset, size):
    assert x.dtype == torch.float32 and y.dtype == weight.dtype and weight.shape[-2] == size, (x.dtype, weight.shape)
    w = weight.reshape(weight.shape[0], -1, weight.shape[-1]).float()
    for t, slot in _rows(indices):
        y[t, offset: offset + size] = (y[t, offset: offset + size].float() + w[slot] @ x[t]).to(y.dtype)
    return y


def _per_token(lora_indices, seq_len, rows):
    assert seq_len.dtype == torch.int64
    return token_indices(lora_indices, seq_len, rows)


_LIB = torch.library.Library("_C_ascend", "FRAGMENT")  # noqa: TOR901 - a stand-in for vLLM-Ascend's namespace
for schema, impl in (
        ("bgmv_shrink(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, float scale) -> ()", _shrink),
        ("bgmv_expand(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, int slice_offset, int slice_size) "
         "-> Tensor", lambda x, w, i, y, o, s: _expand(x, w, i, y, o, s).clone()),
        ("sgmv_shrink(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y, float scale) -> ()",
         lambda x, w, li, sl, y, scale: _shrink(x, w, _per_token(li, sl, x.shape[0]), y, scale)),
        ("sgmv_expand(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y, int slice_offset, "
         "int slice_size) -> Tensor", lambda x, w, li, sl, y, o, s: _expand(x, w, _per_token(li, sl, x.shape[0]),
                                                                             y, o, s).clone())):
    _LIB.define(schema)
    _LIB.impl(schema.partition("(")[0], impl, "CPU")


class StandInNpuOps(TorchNpuLoRAOps):
    name = "npu-lora-standin"


TOKENS, HIDDEN, RANK, OUT = 6, 16, 8, 24
INDICES = torch.tensor([-1, 1, 0, -1, 1, 1])


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(3)
    dt = torch.bfloat16
    return {"x": torch.randn(TOKENS, HIDDEN, generator=g).to(dt), "a": torch.randn(2, 1, RANK, HIDDEN, generator=g).to(dt),
            "h": torch.randn(TOKENS, RANK, generator=g), "b": torch.randn(2, 1, OUT, RANK, generator=g).to(dt),
            "y": torch.randn(TOKENS, OUT, generator=g).to(dt)}


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_shrink_equals_the_reference_with_base_rows_zero(data, out_dtype):
    npu, ref = StandInNpuOps(), get_ops("reference", "cpu")
    got, want = torch.full((TOKENS, RANK), 5.0, dtype=out_dtype), torch.zeros(TOKENS, RANK, dtype=out_dtype)
    npu.bgmv_shrink(data["x"], data["a"], got, INDICES, 0.5)
    ref.bgmv_shrink(data["x"].float(), data["a"].float(), want, INDICES, 0.5)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert torch.count_nonzero(got[INDICES < 0]) == 0
    got.fill_(5.0)
    npu.sgmv_shrink(data["x"], data["a"], got, torch.tensor([-1, 1]), torch.tensor([2, 3]), 0.5)
    ref.sgmv_shrink(data["x"].float(), data["a"].float(), want, torch.tensor([-1, 1]), torch.tensor([2, 3]), 0.5)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert torch.count_nonzero(got[[0, 1, 5]]) == 0  # the base group and the token past the groups


@pytest.mark.parametrize("add_inputs", [True, False])
@pytest.mark.parametrize("offset, size", [(0, OUT), (0, 20), (8, 8)])
def test_expand_equals_the_reference_and_keeps_base_rows(data, add_inputs, offset, size):
    npu, ref = StandInNpuOps(), get_ops("reference", "cpu")
    weights = data["b"][:, :, :size] if offset else data["b"]  # a slice's own weights, or whole (wider: padding)
    got, want = data["y"].clone(), data["y"].float()
    npu.bgmv_expand(data["h"], weights, got, INDICES, offset, size, add_inputs)
    ref.bgmv_expand(data["h"], weights.float(), want, INDICES, offset, size, add_inputs)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[INDICES < 0], data["y"][INDICES < 0], rtol=0, atol=0)
    groups = (torch.tensor([1, -1, 0]), torch.tensor([2, 2, 1]))
    got, want = data["y"].clone(), data["y"].float()
    npu.sgmv_expand(data["h"], weights, got, *groups, offset, size, add_inputs)
    ref.sgmv_expand(data["h"], weights.float(), want, *groups, offset, size, add_inputs)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[[2, 3, 5]], data["y"][[2, 3, 5]], rtol=0, atol=0)

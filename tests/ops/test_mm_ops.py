"""The seam's vision-language ops (mrope, the vision encoder's attention) against their oracles.

* mrope: vLLM's own ``MRotaryEmbedding.forward_native`` (sections and Qwen3-VL's interleaved form,
  NeoX and GPT-J pairs, partial rotary, 1-D text positions).
* encoder attention: float64 softmax attention computed sequence by sequence (no torch SDPA inside).
* the torch_npu provider, given a stand-in ``torch_npu`` written from the documented contracts of
  ``npu_mrope`` and ``npu_fused_infer_attention_score`` (which refuses head dims in (64, 128), as
  vLLM-Ascend's padding implies): the provider's adaptation (host sequence ends, head-dim padding, the
  rotary and cache modes) must give the reference provider's results.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ascend_kernel.ops import get_ops
from ascend_kernel.ops.mm_npu import TorchNpuMMOps, padded_head_dim
from ascend_kernel.ops.mm_reference import ReferenceMMOps

ops = get_ops("reference", "cpu")


def _vllm_mrope(head_size: int, rotary_dim: int, section: list[int], neox: bool, interleaved: bool):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    with set_current_vllm_config(VllmConfig()):
        return MRotaryEmbedding(head_size, rotary_dim, 128, 10000.0, neox, torch.float32,
                                mrope_section=section, mrope_interleaved=interleaved)


def _mrope_inputs(seed: int, tokens: int, dims: int, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 128 * 4, (3, tokens), generator=gen)
    q = torch.randn(tokens, 4 * dims, generator=gen).to(dtype)
    k = torch.randn(tokens, 2 * dims, generator=gen).to(dtype)
    return positions, q, k


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_mrope_matches_vllm_native(interleaved: bool, neox: bool, rotary_dim: int) -> None:
    section = [8, 12, 12] if rotary_dim == 64 else [4, 6, 6]
    layer = _vllm_mrope(64, rotary_dim, section, neox, interleaved)
    positions, q, k = _mrope_inputs(0, 11, 64)
    cache = layer.cos_sin_cache
    for pos in (positions, positions[0]):  # multimodal [3, T], then text-only [T]
        ours = ops.mrope(pos, q.clone(), k.clone(), cache, 64, section, neox, interleaved)
        expected = layer.forward_native(pos, q.clone(), k.clone())
        for a, b in zip(ours, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(ours[0], q)
        if rotary_dim < 64:  # the rest of each head passes through
            assert torch.equal(ours[0].view(11, 4, 64)[..., rotary_dim:], q.view(11, 4, 64)[..., rotary_dim:])


def test_mrope_sections_take_their_own_axis_and_bf16_stays_close() -> None:
    layer = _vllm_mrope(64, 64, [8, 12, 12], True, False)
    positions, q, k = _mrope_inputs(1, 7, 64, torch.bfloat16)
    moved = positions.clone()
    moved[2] += 1  # only the width axis moves: only the last 12 pairs may change
    a = ops.mrope(positions, q, k, layer.cos_sin_cache, 64, [8, 12, 12], True, False)[0].view(7, 4, 64).float()
    b = ops.mrope(moved, q, k, layer.cos_sin_cache, 64, [8, 12, 12], True, False)[0].view(7, 4, 64).float()
    pairs_changed = ((a - b).abs() > 0).view(7, 4, 2, 32).any(dim=(0, 1, 2))
    assert pairs_changed.tolist() == [False] * 20 + [True] * 12
    expected = layer.forward_native(positions, q.clone(), k.clone())[0].float()
    torch.testing.assert_close(a.view(7, -1), expected, atol=3e-2, rtol=2e-2)


def _naive_encoder_attention(q, k, v, bounds, scale):
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s, e in zip(bounds[:-1], bounds[1:]):
        kk = k[s:e].double().repeat_interleave(group, dim=1)
        vv = v[s:e].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,mhd->hnm", q[s:e].double(), kk) * scale
        out[s:e] = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), vv)
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(2, 2, 64), (4, 2, 80), (2, 1, 16)])
def test_encoder_attention_stays_within_each_sequence(heads: int, kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(heads * head_dim)
    bounds = [0, 5, 21, 22, 40]  # ragged images/windows, one of a single token
    q = torch.randn(40, heads, head_dim, generator=gen)
    k, v = (torch.randn(40, kv_heads, head_dim, generator=gen) for _ in range(2))
    scale = 1 / math.sqrt(head_dim)
    out = ops.mm_encoder_attention(q, k, v, torch.tensor(bounds, dtype=torch.int32), scale)
    torch.testing.assert_close(out.double(), _naive_encoder_attention(q, k, v, bounds, scale), atol=1e-5, rtol=1e-5)
    one = ops.mm_encoder_attention(q, k, v, torch.tensor([0, 40], dtype=torch.int32), scale)
    assert not torch.allclose(one, out, atol=1e-3)  # the sequence bounds matter


# -- the torch_npu provider, against a stand-in written from the documented contracts -----------------------


def _fia(query, key, value, *, atten_mask, block_table, input_layout, block_size, actual_seq_lengths,
         actual_seq_lengths_kv, num_heads, num_key_value_heads, scale, sparse_mode, pre_tokens, next_tokens):
    assert input_layout == "TND" and atten_mask is None and block_table is None and sparse_mode == 0
    assert isinstance(actual_seq_lengths, list) and actual_seq_lengths == actual_seq_lengths_kv
    assert actual_seq_lengths[-1] == query.shape[0], "cumulative ends, the last one the token count"
    assert (query.shape[1], key.shape[1]) == (num_heads, num_key_value_heads)
    assert not 64 < query.shape[-1] < 128, f"head dim {query.shape[-1]} needs padding to 128"
    out = _naive_encoder_attention(query, key, value, [0, *actual_seq_lengths], scale).to(query.dtype)
    return out, torch.empty(1)


def _npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section, rotary_mode, cache_mode):
    assert rotary_mode in ("half", "interleave") and cache_mode in ("default", "interleave")
    assert (positions.ndim == 1) == (mrope_section == [0, 0, 0])
    neox, interleaved = rotary_mode == "half", cache_mode == "interleave"
    return ReferenceMMOps.mrope.eager(None, positions, query, key, cos_sin_cache, head_size, mrope_section,
                                      neox, interleaved)


def _npu_provider() -> TorchNpuMMOps:
    provider = TorchNpuMMOps()
    provider._npu = SimpleNamespace(npu_fused_infer_attention_score=_fia, npu_mrope=_npu_mrope)
    return provider


@pytest.mark.parametrize("head_dim", [64, 72, 80, 128])
def test_npu_encoder_attention_pads_head_dims_between_64_and_128(head_dim: int) -> None:
    assert padded_head_dim(head_dim) == (128 if 64 < head_dim < 128 else head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn(30, 2, head_dim, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32)
    ours = _npu_provider().mm_encoder_attention(q, k, v, cu, 1 / math.sqrt(head_dim))
    assert ours.shape == q.shape
    torch.testing.assert_close(ours, ops.mm_encoder_attention(q, k, v, cu, 1 / math.sqrt(head_dim)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_npu_mrope_passes_sections_and_modes(interleaved: bool) -> None:
    layer = _vllm_mrope(64, 64, [8, 12, 12], False, interleaved)
    positions, q, k = _mrope_inputs(2, 5, 64)
    for pos in (positions, positions[0]):
        ours = _npu_provider().mrope(pos, q, k, layer.cos_sin_cache, 64, [8, 12, 12], False, interleaved)
        expected = layer.forward_native(pos, q.clone(), k.clone())
        torch.testing.assert_close(ours[0], expected[0], atol=1e-5, rtol=1e-5)


def test_ops_are_opaque_registered_ops_with_fakes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(6, 128), torch.empty(6, 64)
        rq, rk = ops.mrope(torch.zeros(3, 6, dtype=torch.long), q, k, torch.empty(64, 64), 64, [8, 12, 12], True,
                           False)
        assert rq.shape == q.shape and rk.shape == k.shape
        out = ops.mm_encoder_attention(torch.empty(6, 2, 64), torch.empty(6, 2, 64), torch.empty(6, 2, 64),
                                       torch.tensor([0, 6]), 0.125)
        assert out.shape == (6, 2, 64)

"""Int8 and int4 experts on the stand-in device: the NPU provider against the reference, at TP=1 and TP=2.

The int4 checkpoint is msModelSlim's layout (its packer and ``scale_bias``
function when msModelSlim is installed): the fake's A8W4 grouped matmul
gives the right product only with that ``scale_bias`` (issue 41, bug 3), so a
recomputed or ignored bias, a repacked weight or a masked scale shows here.
"""

from __future__ import annotations

import types

import pytest
import torch

from npu import fake_torch_npu
from npu.standin import DEVICE, host, npu

E, H, INTER = 3, 32, 16  # experts, hidden, intermediate (per expert)


def _pack_rows(values: torch.Tensor) -> torch.Tensor:
    """[.., N, K] int4 values -> [.., N/2, K] bytes: row 2j in the low nibble, row 2j + 1 in the high one."""
    return ((values[..., 0::2, :] & 0xF) | (values[..., 1::2, :] << 4)).to(torch.int8)


def _scale_bias(name: str, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """msModelSlim's ``scale_bias`` of one linear: 8 * sum_k w * scale, per output row ([N, 1] or [N, 16] for down)."""
    product = values.float() * scale
    if "down" in name:
        return 8 * product.reshape(product.shape[0], 16, -1).sum(-1)
    return 8 * product.sum(dim=1, keepdim=True)


def _checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    """Per-expert int4 values, scales and msModelSlim's tensors, as vLLM's loader would place them (w13, w2)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(-8, 8, (E, 2 * INTER, H), generator=g, dtype=torch.int8)
    w2 = torch.randint(-8, 8, (E, H, INTER), generator=g, dtype=torch.int8)
    s13 = torch.rand(E, 2 * INTER, 1, generator=g) * 0.02 + 0.005
    s2 = torch.rand(E, H, 1, generator=g) * 0.02 + 0.005
    return {"w13_values": w13, "w2_values": w2, "w13_weight_scale": s13, "w2_weight_scale": s2,
            "w13_scale_bias": torch.stack([_scale_bias("gate_up", w, s) for w, s in zip(w13, s13)]),
            "w2_scale_bias": torch.stack([_scale_bias("down", w, s) for w, s in zip(w2, s2)])}


def test_the_test_checkpoint_is_msmodelslims():
    """The packer and scale_bias above are msModelSlim's own (its ascendv1 saver), when it is installed."""
    from tests.msmodelslim_pack import load

    pack = load()
    if pack is None:
        pytest.skip("msmodelslim is not installed")
    ckpt = _checkpoint()
    for e in range(E):
        assert torch.equal(pack.w4a8_pack_int4(ckpt["w2_values"][e]), _pack_rows(ckpt["w2_values"][e]))
        down = ckpt["w2_values"][e].float() * ckpt["w2_weight_scale"][e]
        torch.testing.assert_close(pack.process_scale("mlp.experts.0.down_proj", down, 16), ckpt["w2_scale_bias"][e])
        up = ckpt["w13_values"][e].float() * ckpt["w13_weight_scale"][e]
        torch.testing.assert_close(pack.process_scale("mlp.experts.0.up_proj", up, 16), ckpt["w13_scale_bias"][e])


def _shard(ckpt: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """What vLLM's expert loader gives TP rank ``rank``: gate/up rows and down columns split, down's bias whole."""
    part = INTER // size
    rows = torch.cat([torch.arange(rank * part, (rank + 1) * part), INTER + torch.arange(rank * part, (rank + 1) * part)])
    return {"w13_values": ckpt["w13_values"][:, rows], "w13_weight_scale": ckpt["w13_weight_scale"][:, rows],
            "w13_scale_bias": ckpt["w13_scale_bias"][:, rows],
            "w2_values": ckpt["w2_values"][:, :, rank * part:(rank + 1) * part],
            "w2_weight_scale": ckpt["w2_weight_scale"], "w2_scale_bias": ckpt["w2_scale_bias"]}


def _experts(ops, ckpt: dict[str, torch.Tensor], int4: bool, rank: int = 0, size: int = 1, on=lambda t: t):
    from ascend_kernel_plugins.quantization.int8_experts import (
        AscendInt4FusedMoEMethod,
        AscendInt8FusedMoEMethod,
        Int8LocalExperts,
    )

    cls = AscendInt4FusedMoEMethod if int4 else AscendInt8FusedMoEMethod
    method = cls.__new__(cls)
    method.seam_ops = ops
    method.moe = types.SimpleNamespace(tp_rank=rank, tp_size=size)
    layer = types.SimpleNamespace()
    for stem in ("w13", "w2"):
        values = ckpt[f"{stem}_values"]
        setattr(layer, f"{stem}_weight", types.SimpleNamespace(data=on(_pack_rows(values) if int4 else values)))
        setattr(layer, f"{stem}_weight_scale", types.SimpleNamespace(data=on(ckpt[f"{stem}_weight_scale"])))
        setattr(layer, f"{stem}_scale_bias", types.SimpleNamespace(data=on(ckpt[f"{stem}_scale_bias"])))
    slot_of = on(torch.arange(E))
    return Int8LocalExperts(slot_of=slot_of, local_experts=E, ops=ops, **method.expert_weights(layer))


def _rows(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(9, H, generator=g).to(torch.bfloat16), torch.tensor([4, 0, 3])  # 2 rows past the groups


@pytest.mark.parametrize("int4", [True, False], ids=["W4A8_DYNAMIC", "W8A8_DYNAMIC"])
def test_experts_on_the_device_equal_the_reference(npu_ops, int4):
    from ascend_kernel.ops import get_ops

    ckpt = _checkpoint()
    rows, counts = _rows()
    want = _experts(get_ops("reference"), ckpt, int4).mlp(rows, counts)
    got = _experts(npu_ops, ckpt, int4, on=npu).mlp(npu(rows), npu(counts))
    assert got.device == DEVICE and got.dtype == torch.bfloat16
    torch.testing.assert_close(host(got).float(), want.float(), rtol=3e-2, atol=3e-2 * float(want.abs().max()))
    assert not host(got)[7:].any()


def test_int4_experts_at_tp2_sum_to_the_whole_layer(npu_ops):
    """Each rank takes its own share of down_proj's scale_bias column groups; the partial outputs add up."""
    from ascend_kernel.ops import get_ops

    ckpt = _checkpoint()
    rows, counts = _rows()
    want = _experts(get_ops("reference"), ckpt, True).mlp(rows, counts).float()
    got = sum(host(_experts(npu_ops, _shard(ckpt, r, 2), True, r, 2, on=npu).mlp(npu(rows), npu(counts))).float()
              for r in range(2))
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * float(want.abs().max()))


def test_int4_experts_pass_what_vllm_ascend_passes(npu_ops):
    """Parity with vllm-ascend's W4A8_DYNAMIC MoE method for msModelSlim's checkpoints (same calls, same forms)."""
    ckpt = _checkpoint()
    experts = _experts(npu_ops, ckpt, True, on=npu)
    casts = [c for c in fake_torch_npu.CALLS if c[0] == "npu_format_cast"]
    assert [c[1][1] for c in casts] == [29, 29]  # FRACTAL_NZ, before the int32 view
    assert [tuple(c[1][0].shape) for c in casts] == [(E, H, INTER), (E, INTER, H // 2)]  # packed bytes, transposed
    assert experts.w13.dtype == torch.int32 and tuple(experts.w13.shape) == (E, H, 2 * INTER // 8)
    assert experts.w2.dtype == torch.int32 and tuple(experts.w2.shape) == (E, INTER, H // 8)
    raw = ckpt["w13_weight_scale"].squeeze(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert experts.w13_scale.dtype == torch.int64 and torch.equal(host(experts.w13_scale), raw)  # unmasked bits
    torch.testing.assert_close(host(experts.w2_bias), ckpt["w2_scale_bias"].sum(-1))  # the checkpoint's own bias
    assert not any(c[0] in ("npu_convert_weight_to_int4pack", "npu_trans_quant_param") for c in fake_torch_npu.CALLS)


def test_int8_experts_scale_goes_in_the_output_dtype(npu_ops):
    """vllm-ascend casts the per-token grouped matmul's scale to the output dtype (bfloat16 here)."""
    rows, counts = _rows()
    _experts(npu_ops, _checkpoint(), False, on=npu).mlp(npu(rows), npu(counts))
    scales = [c[2]["scale"][0].dtype for c in fake_torch_npu.CALLS if c[0] == "npu_grouped_matmul"]
    assert scales == [torch.bfloat16, torch.bfloat16]

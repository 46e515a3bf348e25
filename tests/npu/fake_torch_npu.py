"""A fake ``torch_npu``: the ops the kernel's NPU providers call, from torch_npu's documented signatures.

Written from torch_npu's API documentation and from how vllm-ascend calls the
same ops (its quantization methods and fused-MoE MLP), not from this project's
providers. Each op checks what the device kernel checks (every tensor on the
NPU, the dtypes and shapes it accepts) and computes the documented result on
the host values of :mod:`npu.standin` tensors. Every call is appended to
``CALLS`` as ``(name, args, kwargs)`` so a test can compare the arguments with
vllm-ascend's.

int4 weights (``npu_grouped_matmul`` with an int32 weight): eight int4 values
per int32 along the output dimension, value ``i`` in bits ``4i..4i+3`` (what
viewing msModelSlim's byte pairs as int32 gives on a little-endian host). The
A8W4 kernel splits each int8 activation into a signed high nibble and an
unsigned low one shifted by 8, so its integer product lacks ``8 * sum_k w``
per output channel: the caller passes ``bias = 8 * sum_k(w * scale)`` to add
it back (msModelSlim's ``scale_bias``, summed over its column groups). A
wrong or missing bias gives a wrong result here, as on the device.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from npu.standin import NpuTensor, host, npu, on_device
from npu.standin_hccl import current_rank, fabric_named

CALLS: list[tuple[str, tuple, dict]] = []
#: storage formats of the tensors npu_format_cast made (by id of the returned tensor)
FORMATS: dict[int, int] = {}
ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ = 2, 29


def _log(name: str, args: tuple, kwargs: dict) -> None:
    CALLS.append((name, args, kwargs))


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def get_npu_format(tensor: torch.Tensor) -> int:
    return FORMATS.get(id(tensor), ACL_FORMAT_ND)


def npu_format_cast(tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
    _log("npu_format_cast", (tensor, acl_format), {})
    on_device(tensor)
    _check(acl_format in (ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ), f"unsupported acl_format {acl_format}")
    out = npu(host(tensor))
    FORMATS[id(out)] = acl_format
    return out


def npu_quantize(input: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, dtype: Any,
                 axis: int = 1, div_mode: bool = True) -> torch.Tensor:
    """``div_mode=False``: ``round(input * scales + zero_points)`` (half to even), saturated to int8."""
    _log("npu_quantize", (input, scales, zero_points, dtype, axis, div_mode), {})
    on_device(input, scales, zero_points)
    _check(dtype == torch.qint8, f"npu_quantize: dtype {dtype} (this fake serves torch.qint8)")
    if not div_mode:
        _check(scales.dtype == input.dtype and (zero_points is None or zero_points.dtype == input.dtype),
               "npu_quantize(div_mode=False): scales and zero_points must have input's dtype")
    x, s = host(input).float(), host(scales).float()
    z = host(zero_points).float() if zero_points is not None else torch.zeros(1)
    y = x / s + z if div_mode else x * s + z
    return npu(torch.round(y).clamp(-128, 127).to(torch.int8))


def npu_dynamic_quant(input: torch.Tensor, *, smooth_scales: Any = None, group_index: Any = None,
                      dst_type: Any = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: ``scale = max|row| / 127`` (float32, one per row), ``round(x / scale)``."""
    _log("npu_dynamic_quant", (input,), {"dst_type": dst_type})
    on_device(input)
    _check(input.dtype in (torch.float16, torch.bfloat16), f"npu_dynamic_quant: input dtype {input.dtype}")
    x = host(input).float()
    scale = x.abs().amax(dim=-1) / 127.0
    q = torch.where(scale.unsqueeze(-1) > 0, torch.round(x / scale.clamp_min(1e-30).unsqueeze(-1)), 0.0)
    return npu(q.clamp(-128, 127).to(torch.int8)), npu(scale)


def _scale_values(scale: torch.Tensor, mask: bool) -> torch.Tensor:
    """A scale as float32: int64 holds float32 bits (``npu_trans_quant_param``'s form, or raw bits)."""
    values = host(scale)
    if values.dtype != torch.int64:
        return values.float()
    bits = values & (0xFFFFE000 if mask else 0xFFFFFFFF)
    return bits.to(torch.int32).view(torch.float32)


def npu_trans_quant_param(scale: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """float32 scale -> int64 whose low 32 bits are the float32 bits the device keeps (sign, exponent, 10 bits)."""
    _log("npu_trans_quant_param", (scale, offset), {})
    on_device(scale, offset)
    _check(scale.dtype == torch.float32, f"npu_trans_quant_param: scale dtype {scale.dtype}, expected float32")
    bits = host(scale).view(torch.int32).to(torch.int64) & 0xFFFFE000
    return npu(bits)


def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *, offset: Any = None,
                     pertoken_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     output_dtype: Any = None) -> torch.Tensor:
    """int8 ``x1 [M, K] @ x2 [K, N]``; int32 bias added before the scales, a float bias after."""
    _log("npu_quant_matmul", (x1, x2, scale), {"pertoken_scale": pertoken_scale, "bias": bias,
                                               "output_dtype": output_dtype})
    on_device(x1, x2, scale, pertoken_scale, bias)
    _check(x1.dtype == torch.int8 and x2.dtype == torch.int8, "npu_quant_matmul: x1 and x2 must be int8")
    _check(x1.shape[-1] == x2.shape[0], f"npu_quant_matmul: K mismatch {tuple(x1.shape)} @ {tuple(x2.shape)}")
    if output_dtype == torch.float16 and pertoken_scale is None:
        _check(scale.dtype == torch.int64, "npu_quant_matmul: float16 output without pertoken_scale takes the "
                                           "int64 scale of npu_trans_quant_param")
    acc = host(x1).to(torch.int64) @ host(x2).to(torch.int64)
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + host(bias).to(torch.int64)
    out = acc.double() * _scale_values(scale, mask=True).double()
    if pertoken_scale is not None:
        out = out * host(pertoken_scale).double().unsqueeze(-1)
    if bias is not None and bias.dtype != torch.int32:
        out = out + host(bias).double()
    return npu(out.to(output_dtype or torch.int8))


def _unpack_int32_int4(weight: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (weight.unsqueeze(-1) >> shifts) & 0xF
    values = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return values.flatten(-2).to(torch.int64)


def npu_grouped_matmul(x: list, weight: list, *, bias: list | None = None, scale: list | None = None,
                       offset: Any = None, antiquant_scale: Any = None, antiquant_offset: Any = None,
                       per_token_scale: list | None = None, group_list: torch.Tensor | None = None,
                       activation_input: Any = None, activation_quant_scale: Any = None,
                       activation_quant_offset: Any = None, split_item: int = 0, group_type: int | None = None,
                       group_list_type: int = 0, act_type: int = 0, output_dtype: Any = None,
                       tuning_config: Any = None) -> list[torch.Tensor]:
    """One x ``[M, K]``, one weight ``[E, K, N]``, rows grouped by ``group_list`` (running sums or counts)."""
    _log("npu_grouped_matmul", (x, weight), {"bias": bias, "scale": scale, "per_token_scale": per_token_scale,
                                            "group_list": group_list, "split_item": split_item,
                                            "group_type": group_type, "group_list_type": group_list_type,
                                            "output_dtype": output_dtype})
    _check(len(x) == 1 and len(weight) == 1 and split_item in (2, 3) and group_type == 0,
           "this fake serves one x, one weight, split_item 2/3, group_type 0")
    rows, w = x[0], weight[0]
    on_device(rows, w, group_list, *(scale or []), *(bias or []), *(per_token_scale or []))
    ends = host(group_list).to(torch.int64)
    if group_list_type == 1:
        ends = torch.cumsum(ends, 0)
    _check(ends.numel() == w.shape[0], f"group_list has {ends.numel()} groups for {w.shape[0]} experts")
    _check(int(ends[-1]) == rows.shape[0], "group_list must cover every row of x")
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    xs = host(rows)
    if rows.dtype != torch.int8:  # float grouped matmul
        out = torch.cat([xs[s:e].float() @ host(w)[g].float() for g, (s, e) in enumerate(zip(starts, ends))])
        return [npu(out.to(rows.dtype))]
    _check(scale is not None and per_token_scale is not None, "a quantized grouped matmul needs scale and "
                                                              "per_token_scale")
    int4 = w.dtype == torch.int32
    values = _unpack_int32_int4(host(w)) if int4 else host(w).to(torch.int64)
    s = scale[0]
    if int4:
        _check(s.dtype == torch.int64, "int4 weights take int64 scales (float32 bits)")
        _check(bias is not None and bias[0].dtype == torch.float32, "int4 weights need the float32 scale bias")
    elif s.dtype != torch.int64:
        _check(output_dtype != torch.bfloat16 or s.dtype == torch.bfloat16,
               f"per-token quantized grouped matmul with bfloat16 output takes a bfloat16 scale, got {s.dtype}")
    scales = _scale_values(s, mask=False).double().reshape(w.shape[0], -1)
    bias_v = host(bias[0]).double().reshape(w.shape[0], -1) if bias is not None else None
    out = []
    for g, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        acc = xs[a:b].to(torch.int64) @ values[g]
        if int4:  # the A8W4 kernel's product lacks 8 * sum_k w (see the module's docstring)
            acc = acc - 8 * values[g].sum(dim=0)
        y = acc.double() * scales[g]
        if bias_v is not None:
            y = y + bias_v[g]
        out.append(y * host(per_token_scale[0])[a:b].double().unsqueeze(-1))
    return [npu(torch.cat(out).to(output_dtype))]


def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    _log("npu_swiglu", (input,), {"dim": dim})
    on_device(input)
    a, b = host(input).float().chunk(2, dim=dim)
    return npu((torch.nn.functional.silu(a) * b).to(input.dtype))


def _mc2_peers(group_ep: str, ep_world_size: int, ep_rank_id: int, value: Any) -> list[Any]:
    """What every EP rank of ``group_ep`` posted (the kernel's own exchange); one rank: only its own."""
    _check(isinstance(group_ep, str) and group_ep != "", "group_ep must be the HCCL communicator name")
    _check(0 <= ep_rank_id < ep_world_size, f"ep_rank_id {ep_rank_id} outside an EP world of {ep_world_size}")
    if ep_world_size == 1:
        return [value]
    fabric = fabric_named(group_ep)
    _check(fabric is not None, f"no HCCL communicator named {group_ep!r} (not a device group's name)")
    _check(fabric.world == ep_world_size, f"ep_world_size {ep_world_size} but {group_ep!r} has {fabric.world} ranks")
    return fabric.exchange(ep_rank_id, value)


def npu_moe_distribute_dispatch_v2(x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str, ep_world_size: int,
                                   ep_rank_id: int, moe_expert_num: int, *, scales: Any = None,
                                   x_active_mask: torch.Tensor | None = None, expert_shard_type: int = 0,
                                   shared_expert_num: int = 1, shared_expert_rank_num: int = 0, quant_mode: int = 0,
                                   global_bs: int = 0, expert_token_nums_type: int = 1, **_: Any) -> tuple:
    """MC2 dispatch: every EP rank's active (token, expert) pairs go to the rank owning the expert (expert ``e``
    on rank ``e // (moe_expert_num / ep_world_size)``); each rank gets its pairs' rows grouped by local expert
    (then by source rank, then pair), with what combine needs to send them back.

    Returns (expand_x, dynamic_scales, assist_info_for_combine, expert_token_nums, ep_recv_counts,
    tp_recv_counts, expand_scales). The two combine-only outputs are this fake's own forms (the device's differ
    between SoCs; callers hand them to combine untouched): ``assist_info_for_combine`` gives each row's origin
    as ``source rank * (BS * K) + pair`` (pair = token * K + j), ``ep_recv_counts[-1]`` the rows received.
    """
    _log("npu_moe_distribute_dispatch_v2", (x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num),
         {"x_active_mask": x_active_mask, "global_bs": global_bs, "expert_token_nums_type": expert_token_nums_type})
    on_device(x, expert_ids, x_active_mask)
    _check(expert_ids.dtype == torch.int32, f"expert_ids must be int32, got {expert_ids.dtype}")
    _check(x.dtype in (torch.float16, torch.bfloat16), f"x dtype {x.dtype}")
    _check(expert_token_nums_type in (0, 1), "expert_token_nums_type is 0 (running sums) or 1 (counts)")
    _check(moe_expert_num % ep_world_size == 0, f"{moe_expert_num} experts do not split over {ep_world_size} ranks")
    batch, top_k = expert_ids.shape
    _check(global_bs == 0 or global_bs >= batch * ep_world_size, "global_bs below the EP world's batch")
    ids = host(expert_ids).to(torch.int64).reshape(-1)
    _check(bool(((ids >= 0) & (ids < moe_expert_num)).all()), "expert_ids outside 0..moe_expert_num-1")
    active = (host(x_active_mask).repeat_interleave(top_k) if x_active_mask is not None
              else torch.ones_like(ids, dtype=torch.bool))
    posted = _mc2_peers(group_ep, ep_world_size, ep_rank_id, (host(x), ids, active))
    local = moe_expert_num // ep_world_size
    stride = batch * top_k
    rows, origins, counts = [], [], torch.zeros(local, dtype=torch.int64)
    for e in range(local):
        for src, (src_x, src_ids, src_active) in enumerate(posted):
            _check(src_ids.numel() == stride, "every EP rank dispatches the same batch size")
            pairs = torch.nonzero(src_active & (src_ids == ep_rank_id * local + e), as_tuple=True)[0]
            rows.append(src_x[pairs // top_k])
            origins.append(src * stride + pairs)
            counts[e] += pairs.numel()
    received = int(counts.sum())
    capacity = max(global_bs, batch * ep_world_size) * min(local, top_k)
    expand_x = torch.zeros(capacity, x.shape[-1], dtype=x.dtype)
    expand_x[:received] = torch.cat(rows)
    assist = torch.full((capacity,), -1, dtype=torch.int32)
    assist[:received] = torch.cat(origins).to(torch.int32)
    nums = counts if expert_token_nums_type == 1 else torch.cumsum(counts, 0)
    recv = torch.tensor([received], dtype=torch.int32)
    return (npu(expand_x), None, npu(assist), npu(nums), npu(recv), None, npu(torch.ones(capacity)))


def npu_moe_distribute_combine_v2(expand_x: torch.Tensor, expert_ids: torch.Tensor, assist_info_for_combine: torch.Tensor,
                                  ep_send_counts: torch.Tensor, expert_scales: torch.Tensor, group_ep: str,
                                  ep_world_size: int, ep_rank_id: int, moe_expert_num: int, *,
                                  tp_send_counts: Any = None, x_active_mask: torch.Tensor | None = None,
                                  expand_scales: Any = None, global_bs: int = 0, **_: Any) -> torch.Tensor:
    """MC2 combine: each row goes back to its source rank, which sums
    ``out[t] = sum_j expert_scales[t, j] * (row of pair (t, j))`` over the rows every rank sends it."""
    _log("npu_moe_distribute_combine_v2", (expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                                           expert_scales, group_ep, ep_world_size, ep_rank_id),
         {"global_bs": global_bs})
    on_device(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, x_active_mask,
              expand_scales)
    _check(expert_scales.dtype == torch.float32, f"expert_scales must be float32, got {expert_scales.dtype}")
    batch, top_k = expert_ids.shape
    rows = int(host(ep_send_counts)[-1])
    mine = (host(assist_info_for_combine)[:rows].to(torch.int64), host(expand_x)[:rows].double())
    posted = _mc2_peers(group_ep, ep_world_size, ep_rank_id, mine)
    stride = batch * top_k
    out = torch.zeros(batch, expand_x.shape[-1], dtype=torch.float64)
    scales = host(expert_scales).reshape(-1).double()
    for origins, values in posted:
        back = origins // stride == ep_rank_id
        pairs = origins[back] % stride
        out.index_add_(0, pairs // top_k, values[back] * scales[pairs].unsqueeze(-1))
    return npu(out.to(expand_x.dtype))


def _tp_peers(op: str, hcom: str, world_size: int, value: Any) -> tuple[int, list[Any]]:
    """(this rank, what every rank of the TP group ``hcom`` posted), as the fused kernel's own collective sees it."""
    _check(isinstance(hcom, str) and hcom != "", f"{op}: hcom must be the HCCL communicator name")
    _check(world_size in (2, 4, 8, 16, 32), f"{op}: world_size {world_size} not in 2, 4, 8, 16, 32")
    fabric = fabric_named(hcom)
    _check(fabric is not None, f"{op}: no HCCL communicator named {hcom!r} (not a device group's name)")
    _check(fabric.world == world_size, f"{op}: world_size {world_size} but {hcom!r} has {fabric.world} ranks")
    rank = current_rank()
    return rank, fabric.exchange(rank, value)


def _check_matmul(op: str, x1: torch.Tensor, x2: torch.Tensor, bias: Any, comm_turn: int) -> None:
    """The documented limits both fused matmul-collective kernels share."""
    on_device(x1, x2)
    _check(x1.dim() == 2 and x2.dim() == 2, f"{op}: input and x2 must be 2-D")
    _check(x1.dtype in (torch.float16, torch.bfloat16) and x2.dtype == x1.dtype,
           f"{op}: float16/bfloat16 of one dtype, got {x1.dtype} and {x2.dtype}")
    _check(x1.shape[1] == x2.shape[0], f"{op}: k differs ({tuple(x1.shape)} @ {tuple(x2.shape)})")
    _check(256 <= x1.shape[1] < 65535, f"{op}: k {x1.shape[1]} outside [256, 65535)")
    _check(bias is None, f"{op}: a bias is not supported in this version")
    _check(comm_turn == 0, f"{op}: comm_turn must be 0")


def npu_mm_reduce_scatter_base(input: torch.Tensor, x2: torch.Tensor, hcom: str, world_size: int, *,
                               reduce_op: str = "sum", bias: Any = None, x1_scale: Any = None, x2_scale: Any = None,
                               comm_turn: int = 0, output_dtype: Any = None, comm_mode: Any = None) -> torch.Tensor:
    """``reducescatter(input @ x2)`` over the group's ranks along m: rank r gets rows ``r*m/w .. (r+1)*m/w``."""
    _log("npu_mm_reduce_scatter_base", (input, x2, hcom, world_size),
         {"reduce_op": reduce_op, "bias": bias, "comm_turn": comm_turn})
    _check_matmul("npu_mm_reduce_scatter_base", input, x2, bias, comm_turn)
    _check(reduce_op == "sum", f"reduce_op {reduce_op!r}: only 'sum'")
    _check(input.shape[0] % world_size == 0, f"m {input.shape[0]} not divisible by world_size {world_size}")
    product = host(input).double() @ host(x2).double()
    rank, posted = _tp_peers("npu_mm_reduce_scatter_base", hcom, world_size, product)
    rows = input.shape[0] // world_size
    return npu(torch.stack(posted).sum(0)[rank * rows:(rank + 1) * rows].to(input.dtype))


def npu_all_gather_base_mm(input: torch.Tensor, x2: torch.Tensor, hcom: str, world_size: int, bias: Any = None,
                           x1_scale: Any = None, x2_scale: Any = None, gather_index: int = 0,
                           gather_output: bool = True, comm_turn: int = 0, output_dtype: Any = None,
                           comm_mode: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allgather(input) @ x2, allgather(input))``, the ranks' rows in rank order; the second empty without
    ``gather_output``."""
    _log("npu_all_gather_base_mm", (input, x2, hcom, world_size),
         {"bias": bias, "gather_index": gather_index, "gather_output": gather_output, "comm_turn": comm_turn})
    _check_matmul("npu_all_gather_base_mm", input, x2, bias, comm_turn)
    _check(gather_index == 0, "gather_index must be 0 (gather input)")
    _, posted = _tp_peers("npu_all_gather_base_mm", hcom, world_size, host(input))
    gathered = torch.cat(posted)
    out = (gathered.double() @ host(x2).double()).to(input.dtype)
    return npu(out), npu(gathered if gather_output else gathered.new_empty(0))


def _npu_paged_attention(*, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         num_kv_heads: int, num_heads: int, scale_value: float, block_table: torch.Tensor,
                         context_lens: torch.Tensor, out: torch.Tensor, workspace: Any = None) -> None:
    """Decode attention over a paged cache ``[blocks, block_size, kv_heads, d]``, written into ``out``.

    ``context_lens`` are host int32 lengths (the kernel reads them on the host, which is why a captured task
    must be re-issued with each step's lengths); every other tensor is on the device.
    """
    _log("_npu_paged_attention", (), {"context_lens": context_lens.clone(), "workspace": workspace})
    on_device(query, key_cache, value_cache, block_table, out, workspace)
    _check(context_lens.device.type == "cpu" and context_lens.dtype == torch.int32,
           "context_lens must be host int32 lengths")
    _check(block_table.dtype == torch.int32, f"block_table must be int32, got {block_table.dtype}")
    q, kc, vc, table = host(query).double(), host(key_cache).double(), host(value_cache).double(), host(block_table)
    group = num_heads // num_kv_heads
    result = torch.zeros_like(q)
    for b, length in enumerate(context_lens.tolist()):
        slots = [int(table[b, t // kc.shape[1]]) * kc.shape[1] + t % kc.shape[1] for t in range(length)]
        k = kc.reshape(-1, *kc.shape[2:])[slots].repeat_interleave(group, dim=1)  # [L, heads, d]
        v = vc.reshape(-1, *vc.shape[2:])[slots].repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b], k) * scale_value, dim=-1)
        result[b] = torch.einsum("hl,lhd->hd", weights, v)
    out.host.copy_(result.to(out.dtype))


def _npu_paged_attention_get_workspace(*, query: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    _log("_npu_paged_attention_get_workspace", (), {"context_lens": kwargs["context_lens"].clone()})
    on_device(query, kwargs["key_cache"], kwargs["block_table"], kwargs["out"])
    return npu(torch.zeros(64, dtype=torch.uint8))


def make_module() -> types.ModuleType:
    """A fresh ``torch_npu`` module object (its ``_C`` carries ``_weak_ref_tensor``)."""
    module = types.ModuleType("torch_npu")
    for name in ("npu_format_cast", "npu_quantize", "npu_dynamic_quant", "npu_trans_quant_param",
                 "npu_quant_matmul", "npu_grouped_matmul", "npu_swiglu", "get_npu_format",
                 "npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2", "npu_mm_reduce_scatter_base",
                 "npu_all_gather_base_mm", "_npu_paged_attention",
                 "_npu_paged_attention_get_workspace"):
        setattr(module, name, globals()[name])
    module._C = types.SimpleNamespace(_weak_ref_tensor=lambda t: t if isinstance(t, NpuTensor) else _no_ref(t))
    return module


def _no_ref(tensor: torch.Tensor) -> torch.Tensor:
    raise RuntimeError(f"_weak_ref_tensor: a tensor on {tensor.device}, expected npu")

"""Property tests: KV layouts vs vLLM 0.32's own KV-cache configuration and allocator.

Random but valid layer sets (full attention, int8 per-token-head full
attention as the Ascend backend publishes it, MLA, SFA = MLA + indexer, Mamba,
hybrid attention + Mamba) go through vLLM's ``get_kv_cache_configs`` — the
code path the engine uses — and are allocated through the kernel's layout
plugins. Checked for every example:

* bytes: exactly the config's size (no alignment), or within the bound the
  PD alignment allows (each tensor and each layer on a 2 MiB boundary);
* views: shape, strides, dtype and byte offset identical to vLLM's own
  ``allocate_kv_cache`` (the independent oracle) when alignment is off;
* the layout's splits (K/V, nope/rope, indexer, Mamba states, int8 BSH parts)
  tile each page;
* writing block ``i`` of one layer changes no other byte, except block ``i``
  of layers that vLLM deliberately overlays (hybrid groups share pages; a
  block id is owned by one group at a time) — and nothing at all once
  alignment gives every tensor its own region.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import pytest
import torch
from fuzzing import fuzz
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from ascend_kernel.device import Device
from ascend_kernel.kernel import build_kernel
from ascend_kernel.runner.kv_allocation import allocate_kv_caches
from ascend_kernel.settings import load_settings

MIB2 = 2 * 1024 * 1024
KV_LORA_RANK, ROPE_DIM, INDEX_HEAD_DIM = 512, 64, 96


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from ascend_kernel.models import create_tiny_model

    base = tmp_path_factory.mktemp("kvmodels")
    return {"llama": create_tiny_model("llama", base / "llama"),
            "deepseek_v2": create_tiny_model("deepseek_v2", base / "ds")}


def vllm_config(model_dirs, kind: str, layout: str, pd: bool):
    from vllm.config import KVTransferConfig, ModelConfig, VllmConfig

    overrides = {"index_topk": 8, "index_head_dim": INDEX_HEAD_DIM} if kind == "sfa" else {}
    model = ModelConfig(model=str(model_dirs["deepseek_v2" if kind in ("mla", "sfa") else "llama"]),
                        max_model_len=128, dtype="float32", hf_overrides=overrides)
    cfg = VllmConfig(model_config=model)
    cfg.cache_config.kv_cache_layout = layout
    if kind == "int8":
        cfg.cache_config.cache_dtype = "int8_per_token_head"
    if pd:
        cfg.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both")
    return cfg


@dataclass
class Case:
    kind: str
    layers: int
    block_size: int
    heads: int
    head_size: int
    dtype: torch.dtype
    layout: str
    pd: bool
    memory: int


cases = st.builds(
    Case,
    kind=st.sampled_from(["full", "int8", "mla", "sfa", "mamba", "hybrid"]),
    layers=st.integers(1, 3),
    block_size=st.sampled_from([16, 32]),
    heads=st.integers(1, 3),
    head_size=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    layout=st.sampled_from(["LBHNC", "LBNHC"]),
    pd=st.booleans(),
    memory=st.integers(4 << 20, 12 << 20),
)


def make_specs(case: Case) -> dict:
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVQuantMode,
        MambaSpec,
        MLAAttentionSpec,
        SparseCacheRole,
    )

    from ascend_kernel_plugins.attention.ascend.backend import AscendAttentionBackend

    specs = {}
    for i in range(case.layers):
        if case.kind in ("full", "hybrid"):
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=case.block_size, num_kv_heads=case.heads, head_size=case.head_size, dtype=case.dtype)
        if case.kind == "int8":  # the spec the engine gets once the Ascend backend customised it
            specs[f"model.layers.{i}.self_attn.attn"] = AscendAttentionBackend.customize_spec(FullAttentionSpec(
                block_size=case.block_size, num_kv_heads=case.heads, head_size=case.head_size, dtype=torch.int8,
                kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD))
        if case.kind in ("mla", "sfa"):
            specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=case.block_size, num_kv_heads=1, head_size=KV_LORA_RANK + ROPE_DIM, dtype=case.dtype)
        if case.kind == "sfa":
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
                block_size=case.block_size, num_kv_heads=1, head_size=INDEX_HEAD_DIM, dtype=case.dtype,
                cache_role=SparseCacheRole.INDEXER)
        if case.kind in ("mamba", "hybrid"):
            specs[f"model.layers.{i}.mixer"] = MambaSpec(
                block_size=128, shapes=((3, 64 * case.heads), (case.heads, 16, 16)), dtypes=(case.dtype, case.dtype))
    return specs


EXPECTED_LAYOUT = {"FullAttentionSpec": "standard", "MambaSpec": "mamba"}


def allocate(case: Case, model_dirs):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    cfg = vllm_config(model_dirs, case.kind, case.layout, case.pd)
    kv_config = get_kv_cache_configs(cfg, [make_specs(case)], [case.memory])[0]
    kernel = build_kernel(load_settings(), "cpu")
    caches, report = allocate_with(kernel, cfg, kv_config)
    return cfg, kv_config, kernel, caches, report


def allocate_with(kernel, cfg, kv_config):
    """The kernel's allocation of ``kv_config``, as the runner does it."""
    return allocate_kv_caches(kv_config, layout_for=lambda t: kernel.kv_layout(t, cfg), vllm_config=cfg,
                              device=Device("cpu"), torch_device=torch.device("cpu"), kernel_block_sizes=None,
                              runner_only_layers=set())


def spec_of(kv_config, layer):
    from ascend_kernel.runner.kv_allocation import spec_of_layer

    return spec_of_layer(kv_config, layer)[1]


def page_ranges(view: torch.Tensor, block: int) -> tuple[int, int]:
    """[start, end) byte addresses of one block's page in a 4-D page view."""
    page = view[block]
    item = view.element_size()
    lo = page.data_ptr()
    hi = lo + sum((n - 1) * s for n, s in zip(page.shape, page.stride())) * item + item
    return lo, hi


def assert_bsh_parts_tile_pages(view: torch.Tensor, spec) -> None:
    """K, V and both scale arrays of every block sit inside its page, disjoint, covering it exactly."""
    from ascend_kernel_plugins.kv_cache.int8_bsh import bsh_parts

    parts = bsh_parts(view, spec.num_kv_heads, spec.head_size, spec.head_size_v)
    n, h = spec.block_size, spec.num_kv_heads
    assert parts.key.shape == (view.shape[0], n, h, spec.head_size) and parts.key.dtype == torch.int8
    assert parts.key.flatten(2).shape == (view.shape[0], n, h * spec.head_size)  # BSH without a copy
    assert parts.key_scale.shape == (view.shape[0], n, h) and parts.key_scale.dtype == torch.float32
    for block in (0, view.shape[0] - 1):
        page_lo, page_hi = page_ranges(view, block)
        spans = sorted(page_ranges(p.reshape(p.shape[0], 1, 1, -1), block) for p in parts)
        assert spans[0][0] == page_lo and spans[-1][1] == page_hi
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # back to back, no overlap, no gap


@fuzz(40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_layouts_match_vllm_config_and_allocator(case, model_dirs):
    from vllm.v1.worker.utils import allocate_kv_cache

    cfg, kv_config, kernel, caches, report = allocate(case, model_dirs)
    size = kv_config.kv_cache_tensors[0].size
    names = {n for g in kv_config.kv_cache_groups for n in g.layer_names}
    assert set(caches) == names

    # the layout each spec kind got
    chosen = {r.subject: r.chosen for r in kernel.records if r.family == "kv_cache"}
    for subject, name in chosen.items():
        expected = "int8-bsh" if case.kind == "int8" else \
            EXPECTED_LAYOUT.get(subject) or ("sfa" if case.kind == "sfa" else "mla")
        assert name == expected, (subject, name)

    if not case.pd:
        assert report.requested_bytes == report.allocated_bytes == size and report.slack_bytes == 0
        oracle = allocate_kv_cache(kv_config, torch.device("cpu"), cfg.cache_config.get_resolved_kv_cache_layout())
        ours_base = report.backing_data_ptr
        theirs_base = next(iter(oracle.values())).untyped_storage().data_ptr()
        for name, view in caches.items():
            ref = oracle[name]
            assert (view.shape, view.stride(), view.dtype) == (ref.shape, ref.stride(), ref.dtype), name
            assert view.data_ptr() - ours_base == ref.data_ptr() - theirs_base, name
    else:
        placements = kv_config.kv_cache_tensors
        n_layers = sum(len(p.layers) for p in placements)
        overlays = any(a is not b and a.offset < b.offset + b.size and b.offset < a.offset + a.size
                       and (a.offset, a.layers) != (b.offset, b.layers) and a.offset == b.offset
                       for a in placements for b in placements)
        # de-aliased overlays need their own memory; everything else only alignment slack
        budget = (len(placements) if overlays else 1) * size + MIB2 * (1 + len(placements) + n_layers)
        assert report.alignment == MIB2
        assert size <= report.allocated_bytes <= budget
        for placement in kv_config.kv_cache_tensors:
            assert caches[placement.layers[0]].data_ptr() % MIB2 == 0
            blocks = kv_config.num_blocks_of(placement)
            if placement.layer_stride >= blocks * placement.block_stride:  # layer-major: every layer aligned
                assert all(caches[layer].data_ptr() % MIB2 == 0 for layer in placement.layers)

    # splits tile each page exactly
    for name, view in caches.items():
        spec = spec_of(kv_config, name)
        layout = kernel.kv_layout_for(type(spec), cfg)
        if case.kind == "int8":
            assert_bsh_parts_tile_pages(view, spec)
        elif hasattr(layout, "k_and_v"):
            k, v = layout.k_and_v(view, spec.head_size)
            assert k.shape[-1] == spec.head_size and v.shape[-1] == spec.head_size_v
        elif hasattr(layout, "state_views"):
            states = layout.state_views(view, spec)
            assert [tuple(s.shape[1:]) for s in states] == [tuple(s) for s in spec.shapes]
            assert all(s.shape[0] == view.shape[0] for s in states)
            assert states[1].data_ptr() - states[0].data_ptr() == prod(spec.shapes[0]) * states[0].element_size()
        elif getattr(layout, "is_indexer", lambda s: False)(spec):
            assert view.shape[-1] == INDEX_HEAD_DIM
        else:
            nope, rope = layout.nope_and_rope(view)
            assert (nope.shape[-1], rope.shape[-1]) == (KV_LORA_RANK, ROPE_DIM)

    # a write to block i of one layer touches nothing else (but deliberate overlays)
    placement_of = {layer: p for p in kv_config.kv_cache_tensors for layer in p.layers}

    def overlay(a: str, b: str) -> bool:
        if case.pd:
            return False
        pa, pb = placement_of[a], placement_of[b]
        return pa is not pb and pa.offset < pb.offset + pb.size and pb.offset < pa.offset + pa.size

    layers = sorted(caches)
    target = layers[len(layers) // 2]
    blocks = caches[target].shape[0]
    block = blocks // 2
    snapshot = {n: caches[n].view(torch.uint8).clone() if caches[n].dtype != torch.int8 else caches[n].clone()
                for n in layers}
    caches[target][block].view(torch.uint8).fill_(0xA5) if caches[target].dtype != torch.int8 \
        else caches[target][block].fill_(-91)
    for name in layers:
        now = caches[name].view(torch.uint8) if caches[name].dtype != torch.int8 else caches[name]
        changed = (now != snapshot[name]).reshape(now.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
        if name == target:
            assert changed == [block]
        elif overlay(name, target):
            assert set(changed) <= {block}, (name, changed)
        else:
            assert changed == [], (name, changed)


def test_short_config_is_an_error_naming_layers_and_bytes(model_dirs):
    from dataclasses import replace

    from ascend_kernel.errors import KVCacheAllocationError

    case = Case("full", 2, 16, 2, 64, torch.float32, "LBHNC", False, 4 << 20)
    cfg, kv_config, kernel, _, _ = allocate(case, model_dirs)
    short = replace(kv_config, kv_cache_tensors=[replace(t, size=t.size - 1) for t in kv_config.kv_cache_tensors])
    with pytest.raises(KVCacheAllocationError, match=r"model\.layers\.0\.self_attn\.attn.*needs \d+ bytes"):
        allocate_with(kernel, cfg, short)


def test_layer_without_tensor_is_an_error(model_dirs):
    from dataclasses import replace

    from ascend_kernel.errors import KVCacheAllocationError

    case = Case("full", 2, 16, 2, 64, torch.float32, "LBHNC", False, 4 << 20)
    cfg, kv_config, kernel, _, _ = allocate(case, model_dirs)
    group = kv_config.kv_cache_groups[0]
    extra = replace(group, layer_names=[*group.layer_names, "model.layers.9.self_attn.attn"])
    broken = replace(kv_config, kv_cache_groups=[extra])
    with pytest.raises(KVCacheAllocationError, match=r"no KV cache tensor.*model\.layers\.9"):
        allocate_with(kernel, cfg, broken)


def test_mla_head_size_mismatch_names_the_config_dims(model_dirs):
    from ascend_kernel.errors import KVCacheAllocationError

    case = Case("mla", 1, 16, 1, 64, torch.float32, "LBHNC", False, 4 << 20)
    cfg = vllm_config(model_dirs, "mla", "LBHNC", False)
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    kv_config = get_kv_cache_configs(cfg, [{"l.0": MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=320,
                                                                    dtype=torch.float32)}], [case.memory])[0]
    kernel = build_kernel(load_settings(), "cpu")
    with pytest.raises(KVCacheAllocationError, match="320 != kv_lora_rank 512 \\+ qk_rope_head_dim 64"):
        allocate_with(kernel, cfg, kv_config)


def test_sfa_indexer_accepts_vllms_fp8_key_page_and_names_a_wrong_width(model_dirs):
    """vLLM's DeepSeek-V3.2 indexer cache is uint8: 128 fp8 values + one float32 scale per 128 = 132 bytes."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole

    from ascend_kernel.errors import KVCacheAllocationError

    cfg = vllm_config(model_dirs, "sfa", "LBHNC", False)
    cfg.model_config.hf_text_config.index_head_dim = 128
    kernel = build_kernel(load_settings(), "cpu")
    for width, ok in ((132, True), (128, True), (100, False)):
        specs = {"l.0.attn": MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=KV_LORA_RANK + ROPE_DIM,
                                              dtype=torch.float32),
                 "l.0.indexer.k_cache": MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=width,
                                                         dtype=torch.uint8, cache_role=SparseCacheRole.INDEXER)}
        kv_config = get_kv_cache_configs(cfg, [specs], [4 << 20])[0]
        if ok:
            caches, _ = allocate_with(kernel, cfg, kv_config)
            assert caches["l.0.indexer.k_cache"].shape[-1] == width
        else:
            wrong = "head size 100 is neither index_head_dim 128 .* nor vLLM's fp8 key page of 132"
            with pytest.raises(KVCacheAllocationError, match=wrong):
                allocate_with(kernel, cfg, kv_config)

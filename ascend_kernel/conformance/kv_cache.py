"""Contract of the ``kv_cache`` family: views that tile vLLM's pages, and nothing else.

Each scenario below is a set of layers with vLLM ``KVCacheSpec`` s, turned
into a ``KVCacheConfig`` by vLLM's own ``get_kv_cache_configs`` (the code path
the engine uses) for a real config. Attention specs also come in every form
an installed attention backend publishes for them (``customize_spec``, e.g.
the int8 BSH page of the Ascend backend), besides vLLM's own. A layout is
checked on every (scenario, spec class) its ``supports(ctx)`` accepts
(``ctx.subject`` is the spec class), over a zeroed backing buffer of the
config's size:

* ``alignment``: ``alignment(vllm_config)`` is a positive power of two, under
  the plain config and under one with a KV-transfer (PD) config;
* ``views``: ``views(backing, placement, spec, num_blocks, None)`` returns one
  tensor per layer of the placement, each a view of the backing buffer whose
  first dimension indexes the ``num_blocks`` blocks;
* ``covers-vllm-pages``: block ``b`` of layer ``l`` (``view[b]``) addresses
  every byte of the page vLLM's config gives that layer and block (vLLM's own
  ``create_kv_cache_views`` is the oracle);
* ``stays-in-own-page``: it addresses no byte of any other layer's or block's
  page (so no two views overlap).

Blocks 0, the middle one and the last are probed, for every layer, by
filling ``view[b]`` with all-ones bytes and comparing the bytes that changed.
A ``KernelError`` raised by ``views`` (the layout refusing a spec it cannot
serve, with a reason) is not a failure; it is listed, and when a layout
refuses every spec it accepted in ``supports`` the contracts are skipped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ascend_kernel.conformance.results import Checks, describe_exception
from ascend_kernel.errors import KernelError

FAMILY = "kv_cache"
CONTRACTS = ("alignment", "views", "covers-vllm-pages", "stays-in-own-page")
KV_LORA_RANK, ROPE_DIM, INDEX_HEAD_DIM = 512, 64, 96  # the tiny DeepSeek-V2 model's latent sizes
BLOCKS = 12


@dataclass(frozen=True)
class Scenario:
    name: str
    config: str
    specs: Callable[[], dict[str, Any]]  # layer name -> spec
    use_mla: bool = False
    use_sparse: bool = False


def _full(dtype: torch.dtype = torch.float32, **extra: Any) -> Callable[[], dict[str, Any]]:
    def specs() -> dict[str, Any]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        return {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype=dtype, **extra) for i in range(2)}

    return specs


def _int8() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import KVQuantMode

    return _full(torch.int8, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)()


def _mla() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return {f"model.layers.{i}.self_attn.attn": MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=KV_LORA_RANK + ROPE_DIM, dtype=torch.float32) for i in range(2)}


def _sfa() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole

    specs = _mla()
    for i in range(2):
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=INDEX_HEAD_DIM, dtype=torch.float32,
            cache_role=SparseCacheRole.INDEXER)
    return specs


def _mamba() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import MambaSpec

    return {f"model.layers.{i}.mixer": MambaSpec(block_size=128, shapes=((3, 128), (2, 16, 16)),
                                                 dtypes=(torch.float32, torch.float32)) for i in range(2)}


def _sliding() -> dict[str, Any]:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return {f"model.layers.{i}.self_attn.attn": SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=32) for i in range(2)}


SCENARIOS = (
    Scenario("full-attention", "llama", _full()),
    Scenario("full-attention-bf16", "llama", _full(torch.bfloat16)),
    Scenario("full-attention-LBNHC", "llama-LBNHC", _full()),
    Scenario("int8-per-token-head", "llama-int8-kv", _int8),
    Scenario("mla", "deepseek_v2", _mla, use_mla=True),
    Scenario("sfa", "deepseek_v2-sparse", _sfa, use_mla=True, use_sparse=True),
    Scenario("mamba", "llama", _mamba),
    Scenario("sliding-window", "llama", _sliding),
)


def _backend_classes(kit: Any, scenario: Scenario, spec: Any) -> list[tuple[str, Any]]:
    """(entry name, backend class) of every installed attention backend that serves the scenario's layers."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    if not isinstance(spec, AttentionSpec):
        return []
    from vllm.v1.attention.selector import AttentionSelectorConfig

    cfg = kit.config(scenario.config)
    selector = AttentionSelectorConfig(head_size=spec.head_size, dtype=cfg.model_config.dtype,
                                       kv_cache_dtype=cfg.cache_config.cache_dtype, block_size=spec.block_size,
                                       use_mla=scenario.use_mla, use_sparse=scenario.use_sparse)
    classes = []
    for entry in kit.entries.get("attention_backend", []):
        try:
            found, _ = kit.find_context(entry, [scenario.config])
            if found is None:
                continue
            path = entry.build(found.ctx).backend_class_path(None, selector, spec.num_kv_heads, lambda: None)
            if not path:
                continue
            module, _, name = str(path).rpartition(".")
            classes.append((entry.name, getattr(importlib.import_module(module), name)))
        except Exception:  # noqa: BLE001 - that backend's own checks are not this family's
            continue
    return classes


def _spec_forms(kit: Any, scenario: Scenario, specs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """vLLM's own specs, plus each distinct form an installed attention backend publishes for them."""
    forms = [("vLLM's spec", specs)]
    for name, backend in _backend_classes(kit, scenario, next(iter(specs.values()))):
        if not hasattr(backend, "customize_spec"):
            continue
        try:
            custom = {layer: backend.customize_spec(spec) for layer, spec in specs.items()}
        except Exception:  # noqa: BLE001 - a backend that cannot customise this spec publishes no other form
            continue
        if all(custom != known for _, known in forms):
            forms.append((f"spec as attention backend '{name}' publishes it", custom))
    return forms


def _kv_config(cfg: Any, specs: dict[str, Any]) -> Any:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    memory = BLOCKS * sum(spec.page_size_bytes for spec in specs.values())
    return get_kv_cache_configs(cfg, [specs], [memory])[0]


def _spec_of(kv_config: Any, layer: str) -> Any:
    for group in kv_config.kv_cache_groups:
        if layer in group.layer_names:
            spec = group.kv_cache_spec
            per_layer = getattr(spec, "kv_cache_specs", None)
            return per_layer[layer] if per_layer is not None else spec
    raise KeyError(layer)


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _touched(backing: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """The backing bytes ``part`` (a view of ``backing``) addresses: fill it with all-ones bytes, see what changed."""
    backing.zero_()
    as_int = part.view(_INT_OF_SIZE[part.element_size()]) if part.dtype not in _INT_OF_SIZE.values() else part
    as_int.fill_(-1)
    touched = backing != 0
    backing.zero_()
    return touched


class _Outcome:
    """What happened to one contract across all (scenario, spec form, spec class) runs."""

    def __init__(self) -> None:
        self.served: list[str] = []
        self.failure: dict[str, str] = {}

    def fail(self, contract: str, where: str, message: str) -> None:
        self.failure.setdefault(contract, f"{where}: {message}")


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    outcome = _Outcome()
    refusals: list[str] = []
    unsupported: list[str] = []
    layouts: dict[tuple[str, str], Any] = {}
    for scenario in SCENARIOS:
        try:
            specs = scenario.specs()
            cfg = kit.config(scenario.config)
        except Exception as exc:  # noqa: BLE001 - a scenario this vLLM cannot express
            unsupported.append(f"{scenario.name}: not expressible here ({describe_exception(exc)})")
            continue
        for form, layer_specs in _spec_forms(kit, scenario, specs):
            try:
                kv_config = _kv_config(cfg, layer_specs)
            except Exception as exc:  # noqa: BLE001 - vLLM refuses this form; nothing to view
                unsupported.append(f"{scenario.name} ({form}): vLLM gives no KV config ({describe_exception(exc)})")
                continue
            for subject in sorted({type(s) for s in layer_specs.values()}, key=lambda t: t.__name__):
                where = f"{scenario.name} ({subject.__name__}, {form})"
                try:
                    found, reasons = kit.find_context(entry, [scenario.config], subject=subject)
                except Exception as exc:  # noqa: BLE001
                    checks.failed("supports", f"{where}: supports(ctx) raised {describe_exception(exc)}")
                    return
                if found is None:
                    unsupported.append(f"{where}: {reasons[0] if reasons else 'not supported'}")
                    continue
                checks.context = checks.context or found.label
                key = (found.label, subject.__name__)
                if key not in layouts:
                    try:
                        layouts[key] = entry.build(found.ctx)
                    except Exception as exc:  # noqa: BLE001
                        cause = describe_exception(exc.__cause__ or exc)
                        checks.failed("builds", f"{where}: the factory raised {cause}")
                        return
                _run(layouts[key], found, kit, scenario, kv_config, subject, where, outcome, refusals)
    if not outcome.served and not outcome.failure:
        reason = "; ".join(refusals + unsupported) or "no scenario"
        checks.skipped("supported", f"no scenario of the kit was served: {reason}")
        return
    checks.passed("builds", f"{len(layouts)} layout object(s) built")
    served = ", ".join(dict.fromkeys(outcome.served)) or "none"
    for contract in CONTRACTS:
        if contract in outcome.failure:
            checks.failed(contract, outcome.failure[contract])
        elif not outcome.served and contract in ("covers-vllm-pages", "stays-in-own-page"):
            checks.skipped(contract, "no views to probe (see contract 'views')")
        else:
            refused = f"; refused: {'; '.join(refusals)}" if refusals and contract == "views" else ""
            checks.passed(contract, f"served: {served}{refused}")


def _run(layout: Any, found: Any, kit: Any, scenario: Scenario, kv_config: Any, subject: type, where: str,
         outcome: _Outcome, refusals: list[str]) -> None:
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    cfg = found.ctx.vllm_config
    try:
        for name in (scenario.config, "llama-pd"):
            alignment = layout.alignment(kit.config(name) if name != scenario.config else cfg)
            ok = isinstance(alignment, int) and not isinstance(alignment, bool) and alignment >= 1 \
                and alignment & (alignment - 1) == 0
            if not ok:
                outcome.fail("alignment", where, f"alignment(config {name}) returned {alignment!r}, "
                             "not a positive power of two")
    except Exception as exc:  # noqa: BLE001
        outcome.fail("alignment", where, f"alignment(vllm_config) raised {describe_exception(exc)}")

    (size,) = {t.size for t in kv_config.kv_cache_tensors}
    backing = torch.zeros(size, dtype=torch.int8)
    resolved = cfg.cache_config.get_resolved_kv_cache_layout()
    pages: list[tuple[str, int, torch.Tensor, torch.Tensor]] = []  # (layer, block, layout view[b], oracle view[b])
    every_page = torch.zeros(size, dtype=torch.bool)
    served = False
    for placement in kv_config.kv_cache_tensors:
        spec = _spec_of(kv_config, placement.layers[0])
        if type(spec) is not subject:
            continue
        blocks = kv_config.num_blocks_of(placement)
        oracle = create_kv_cache_views(backing, spec, blocks, resolved, placement)
        for view in oracle:
            every_page |= _touched(backing, view)
        try:
            views = layout.views(backing, placement, spec, blocks, None)
        except KernelError as exc:
            refusals.append(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())}")
            continue
        except Exception as exc:  # noqa: BLE001
            outcome.fail("views", where, f"views(...) raised {describe_exception(exc)}")
            continue
        served = True
        views = list(views)
        if len(views) != len(placement.layers):
            outcome.fail("views", where, f"{len(views)} views for the {len(placement.layers)} layers "
                         f"{placement.layers}")
            continue
        for layer, view, ref in zip(placement.layers, views, oracle):
            if not isinstance(view, torch.Tensor) or view.untyped_storage().data_ptr() != \
                    backing.untyped_storage().data_ptr():
                outcome.fail("views", where, f"layer {layer}: the view is not a view of the backing buffer")
                continue
            if view.dim() == 0 or view.shape[0] != blocks:
                outcome.fail("views", where, f"layer {layer}: view shape {tuple(view.shape)}, first dimension "
                             f"is not the {blocks} blocks")
                continue
            for block in sorted({0, blocks // 2, blocks - 1}):
                pages.append((layer, block, view[block], ref[block]))
    if not served:
        return
    outcome.served.append(where)
    for layer, block, mine, theirs in pages:
        got, want = _touched(backing, mine), _touched(backing, theirs)
        missing = int((want & ~got).sum())
        if missing:
            outcome.fail("covers-vllm-pages", where, f"layer {layer} block {block}: {missing} of the page's "
                         f"{int(want.sum())} bytes are not addressed by view[{block}]")
        stray = int((got & ~want & every_page).sum())
        if stray:
            outcome.fail("stays-in-own-page", where, f"layer {layer} block {block}: view[{block}] addresses "
                         f"{stray} bytes of other layers' or blocks' pages")

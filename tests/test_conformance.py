"""The conformance kit: every built-in passes it, and broken implementations fail it naming the contract.

The kit's own sharpness is shown by implementations broken on purpose: a
third-party plugin installed as a dist-info (``tests/thirdparty/broken``: a
sampler returning argmax + 1, a graph mode that shrinks batches), and
in-test implementations of the other families with one defect each.
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from ascend_kernel.conformance import ConformanceError, check_plugin, implementation_cases, run_conformance
from ascend_kernel.conformance.environment import KitEnvironment
from ascend_kernel.conformance.runner import UnknownPluginError, check_implementation
from ascend_kernel.plugin_manager import KernelPluginManager
from ascend_kernel.registry import Implementation
from ascend_kernel.settings import ENV_PREFIX, load_settings

pytest_plugins = ["pytester"]

THIRDPARTY = Path(__file__).resolve().parent / "thirdparty"
BROKEN = THIRDPARTY / "broken"
#: (family, implementation, contract) of the broken plugin's defects
BROKEN_CONTRACTS = {("sampler", "off-by-one", "greedy-argmax"), ("sampler", "off-by-one", "top-k"),
                    ("sampler", "off-by-one", "logprobs"), ("graph", "shrinking", "pads-monotonically")}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kit-cache")


@pytest.fixture
def on_path(monkeypatch):
    def _add(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        importlib.invalidate_caches()

    yield _add
    importlib.invalidate_caches()


def builtin_plugins() -> list[str]:
    return [i.name for i in KernelPluginManager(load_settings()).infos if i.builtin]


@pytest.fixture(scope="module")
def builtin_report(cache_dir):
    return run_conformance(builtin_plugins(), cache_dir=cache_dir)


# -- built-ins ---------------------------------------------------------------------------------


def test_every_builtin_implementation_conforms(builtin_report):
    assert builtin_report.failures == [], "\n".join(f.line() for f in builtin_report.failures)
    checked = {(r.family, r.implementation) for r in builtin_report.results}
    assert {(c.family, c.implementation) for c in implementation_cases(builtin_plugins())} <= checked
    for result in builtin_report.results:
        assert result.plugin and result.family and result.implementation and result.contract and result.reason


@pytest.mark.parametrize(("family", "implementation", "contract"), [
    ("kv_cache", "standard", "covers-vllm-pages"),
    ("kv_cache", "standard", "stays-in-own-page"),
    ("kv_cache", "int8-bsh", "covers-vllm-pages"),  # only on the page the Ascend backend publishes
    ("kv_cache", "mla", "stays-in-own-page"),
    ("kv_cache", "sfa", "covers-vllm-pages"),
    ("kv_cache", "mamba", "covers-vllm-pages"),
    ("kv_cache", "vllm-views", "stays-in-own-page"),
    ("sampler", "vllm-default", "greedy-argmax"),
    ("sampler", "ascend-topk-topp", "top-k"),  # enabled by its feature toggle
    ("attention_state", "standard", "state-for-every-batch"),
    ("attention_state", "standard", "prefill-flag"),
    ("moe_comm_method", "allgather", "dense-equivalence"),
    ("moe_comm_method", "alltoall", "dense-equivalence"),
    ("moe_comm_method", "mc2", "dense-equivalence"),
    ("moe_comm_method", "naive-multicast", "dense-equivalence"),
    ("moe_comm", "ascend", "selects-from-table"),
    ("layer_ops", "ascend", "matches-vllm-native"),
    ("graph", "eager", "pads-monotonically"),
    ("graph", "aclgraph", "pads-to-captured-size"),  # on a simulated NPU: its padding is host logic
    ("graph", "cpu-graph", "static-graph"),
    ("graph", "cpu-graph", "pads-to-captured-size"),
    ("drafter", "ngram", "proposals"),
    ("attention_backend", "ascend", "backend-class"),
    ("fusion_pass", "norm-quant", "same-values"),  # beside the forced `ascend` layer ops
    ("fusion_pass", "qknorm-rope", "same-values"),
    ("fusion_pass", "muls-add", "same-values"),  # a DeepSeek config with a routed scale, on a simulated NPU
])
def test_contracts_really_ran_on_builtins(builtin_report, family, implementation, contract):
    (result,) = [r for r in builtin_report.results
                 if (r.family, r.implementation, r.contract) == (family, implementation, contract)]
    assert result.status == "pass", result.line()
    if family == "fusion_pass":  # a pass that replaced nothing would keep the values trivially
        assert not result.reason.startswith("0 "), result.line()


def test_what_could_not_be_exercised_says_why(builtin_report):
    skipped = [r for r in builtin_report.results if r.status == "skip"]
    for r in skipped:
        assert r.reason, r.line()
    drafters = {r.implementation: r.reason for r in skipped if r.family == "drafter" and r.contract == "proposals"}
    assert all("only the declared interface was checked" in why for why in drafters.values())
    assert {r.plugin for r in skipped if r.contract == "registers"} == {"config-fixups", "kv-transfer", "sleep-mode",
                                                                        "eplb", "vllm-ascend-keys"}


# -- a broken third-party plugin (dist-info under tests/thirdparty/broken) ------------------------


def test_broken_plugin_fails_naming_each_contract(on_path, cache_dir):
    on_path(BROKEN)
    report = run_conformance(["broken"], cache_dir=cache_dir)
    failed = {(r.family, r.implementation, r.contract) for r in report.failures}
    assert failed == BROKEN_CONTRACTS
    assert all(r.plugin == "broken" and r.entry_point == "ascend_kernel.plugins: broken = ak_broken_plugin"
               for r in report.results)
    (greedy,) = [r for r in report.failures if r.contract == "greedy-argmax"]
    assert "argmax is" in greedy.reason and greedy.context.startswith("config llama, device cpu")
    token_ids = [r for r in report.results if r.contract == "token-ids"]
    assert [r.status for r in token_ids] == ["pass"]  # its ids are valid; only the choice is wrong

    with pytest.raises(ConformanceError) as info:
        check_plugin("broken", cache_dir=cache_dir)
    message = str(info.value)
    assert "4 broken contract(s)" in message
    assert "plugin 'broken' sampler 'off-by-one': contract 'greedy-argmax' FAIL" in message
    assert "plugin 'broken' graph 'shrinking': contract 'pads-monotonically' FAIL" in message


def test_cli_exits_non_zero_naming_plugin_implementation_and_contract(on_path, cache_dir, capsys):
    from ascend_kernel.cli.main import main

    on_path(BROKEN)
    rc = main(["conformance", "--plugin", "broken", "--cache-dir", str(cache_dir)])
    out = capsys.readouterr()
    assert rc == 1
    assert "plugin 'broken' sampler 'off-by-one': contract 'greedy-argmax' FAIL" in out.err
    assert "plugin 'broken' graph 'shrinking': contract 'pads-monotonically' FAIL" in out.err
    assert "7 passed, 4 failed, 1 skipped" in out.out  # graph: interface, static-graph, capture-sizes pass


def test_cli_unknown_plugin_is_a_usage_error(capsys):
    from ascend_kernel.cli.main import main

    rc = main(["conformance", "--plugin", "no-such-plugin"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--plugin" in err and "no-such-plugin" in err and "installed:" in err and "sampling" in err
    with pytest.raises(UnknownPluginError):
        run_conformance(["no-such-plugin"])


def test_broken_plugin_is_invisible_without_its_folder_on_the_path():
    assert "broken" not in builtin_plugins()
    with pytest.raises(UnknownPluginError):
        implementation_cases(["broken"])


# -- the test plugins under tests/thirdparty, with two gloo ranks for the MoE method ----------------


def test_thirdparty_test_plugins_conform_on_two_ranks(on_path, cache_dir):
    on_path(THIRDPARTY)
    report = check_plugin("demo", "moe-demo", distributed=True, cache_dir=cache_dir)
    statuses = {(r.implementation, r.contract): r.status for r in report.results}
    assert statuses[("shard-allgather", "dense-equivalence-2-ranks")] == "pass"
    assert statuses[("demo-greedy", "greedy-argmax")] == "pass"
    assert statuses[("demo-moe", "selects-from-table")] == "pass"


def test_a_third_party_fusion_pass_conforms_and_rewrites_the_kits_token_row_norm(on_path, cache_dir):
    """tests/thirdparty/fusion: a pass the kernel does not know swaps the seam's token-row rms_norm for its own
    op; the kit's graph holds one such norm, and the rewritten graph's outputs equal the untouched one's bit for
    bit (the same engine run in tests/e2e/test_model_families.py shows it in a compiled model)."""
    on_path(THIRDPARTY / "fusion")
    report = check_plugin("fusion-demo", cache_dir=cache_dir)
    results = {r.contract: r for r in report.results if r.implementation == "rows-rms-norm"}
    assert {c: r.status for c, r in results.items()} == {"builds": "pass", "same-values": "pass",
                                                          "describes": "pass"}
    assert results["same-values"].reason.startswith("1 pattern(s) replaced")


# -- the pytest plugin ---------------------------------------------------------------------------


def test_pytest_plugin_is_an_entry_point():
    # every distribution, as pytest itself loads them (a stale build's metadata may shadow the installed one)
    eps = {(ep.name, ep.value) for dist in metadata.distributions() for ep in dist.entry_points
           if ep.group == "pytest11"}
    assert ("ascend_kernel", "ascend_kernel.conformance.pytest_plugin") in eps


def test_pytest_plugin_parametrizes_per_implementation_and_names_failures(pytester, on_path, cache_dir):
    on_path(BROKEN)
    pytester.makepyfile(test_broken="""
        import pytest

        pytestmark = pytest.mark.ascend_kernel_plugin("broken")

        def test_conforms(ascend_kernel_implementation):
            ascend_kernel_implementation.assert_conforms()
    """)
    result = pytester.runpytest_inprocess("-v", f"--ascend-kernel-cache-dir={cache_dir}", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*test_conforms?broken:sampler:off-by-one? FAILED*",
        "*test_conforms?broken:graph:shrinking? FAILED*",
        "*contract 'greedy-argmax' FAIL*",
        "*contract 'pads-monotonically' FAIL*",
    ])


# -- the other families' contracts are sharp too (in-test implementations, one defect each) ----------


@pytest.fixture(scope="module")
def kit(cache_dir) -> KitEnvironment:
    kit = KitEnvironment(load_settings(), cache_dir)
    return kit


def run_one(kit: KitEnvironment, family: str, name: str, factory: Any, supports: Any = None) -> dict[str, Any]:
    kwargs = {"supports": supports} if supports is not None else {}
    entry = Implementation(family=family, name=name, factory=factory, **kwargs).with_origin("in-test", "test")
    return {r.contract: r for r in check_implementation(entry, kit)}


def _full_attention_only(ctx: Any) -> str | None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    subject = ctx.subject
    ok = subject is not None and issubclass(subject, FullAttentionSpec) and not issubclass(subject, MLAAttentionSpec)
    return None if ok and ctx.vllm_config.cache_config.cache_dtype == "auto" else "full attention only"


class _VllmPages:
    """vLLM's own page views, then spoiled by ``spoil``."""

    def __init__(self, ctx: Any, spoil: Any) -> None:
        self.layout = ctx.vllm_config.cache_config.get_resolved_kv_cache_layout()
        self.spoil = spoil

    def alignment(self, vllm_config: Any) -> int:
        return 1

    def views(self, backing, placement, spec, num_blocks, kernel_block_size):
        from vllm.v1.kv_cache_interface import create_kv_cache_views

        return self.spoil(create_kv_cache_views(backing, spec, num_blocks, self.layout, placement))


@pytest.mark.parametrize(("defect", "spoil", "broken"), [
    ("correct", lambda views: views, set()),
    ("layers swapped", lambda views: views[::-1], {"covers-vllm-pages", "stays-in-own-page"}),
    ("half of each page", lambda views: [v[..., : v.shape[-1] // 2] for v in views], {"covers-vllm-pages"}),
    ("a copy", lambda views: [v.clone() for v in views], {"views"}),
    ("one view short", lambda views: views[:-1], {"views"}),
    ("raises", lambda views: views[0][10**9], {"views"}),
])
def test_kv_layout_defects_are_named(kit, defect, spoil, broken):
    results = run_one(kit, "kv_cache", f"kv-{defect.replace(' ', '-')}", lambda ctx: _VllmPages(ctx, spoil),
                      _full_attention_only)
    failed = {c for c, r in results.items() if r.status == "fail"}
    assert failed == broken, {c: r.reason for c, r in results.items()}
    if not broken:
        assert "full-attention (FullAttentionSpec" in results["covers-vllm-pages"].reason


def test_moe_method_ignoring_routing_weights_fails_dense_equivalence(kit):
    from ascend_kernel_plugins.moe_comm.methods.allgather import AllGatherMethod

    from ascend_kernel.ops.reference import ReferenceOps

    class Unweighted(AllGatherMethod):
        name = "unweighted"

        def dispatch(self, hidden, topk_weights, topk_ids, experts, parallel):
            return super().dispatch(hidden, torch.ones_like(topk_weights), topk_ids, experts, parallel)

    results = run_one(kit, "moe_comm_method", "unweighted", lambda ctx: Unweighted(ReferenceOps()))
    assert results["attributes"].status == "pass"
    assert results["dense-equivalence"].status == "fail"
    assert "differs from the dense MoE" in results["dense-equivalence"].reason


def test_attention_state_without_prefill_fails_prefill_flag(kit):
    from ascend_kernel_plugins.attention.states import AttentionState

    class AlwaysDecode:
        def decide(self, batch):
            return AttentionState.DecodeOnly

    results = run_one(kit, "attention_state", "always-decode", lambda ctx: AlwaysDecode())
    assert results["state-for-every-batch"].status == "pass"
    assert results["prefill-flag"].status == "fail"
    assert "batch 'prefill'" in results["prefill-flag"].reason


def test_layer_ops_whose_norm_drifts_fails_against_vllm(kit):
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot
    from vllm.model_executor.layers.layernorm import RMSNorm

    class DriftingNorm(RMSNorm):
        def forward_oot(self, x, residual=None):
            out = self.forward_native(x, residual)
            return (out[0] * 1.01, out[1]) if isinstance(out, tuple) else out * 1.01

    class DriftingOps:
        def install(self):
            if op_registry_oot.get("RMSNorm") is not DriftingNorm:
                CustomOp.register_oot(DriftingNorm, name="RMSNorm")
            return ["RMSNorm"]

        def describe(self):
            return {}

    before = dict(op_registry_oot)
    results = run_one(kit, "layer_ops", "drifting", lambda ctx: DriftingOps())
    assert dict(op_registry_oot) == before  # the kit restores vLLM's registry
    assert results["interface"].status == "pass"
    assert results["matches-vllm-native"].status == "fail"
    assert "RMSNorm.forward_oot" in results["matches-vllm-native"].reason


def test_a_factory_that_raises_fails_builds_and_unsupported_is_a_skip(kit):
    def explode(ctx):
        raise ZeroDivisionError("bad arithmetic")

    results = run_one(kit, "graph", "explodes", explode)
    assert results["builds"].status == "fail" and "ZeroDivisionError: bad arithmetic" in results["builds"].reason
    results = run_one(kit, "graph", "never", explode, supports=lambda ctx: "needs hardware nobody has")
    assert [(c, r.status) for c, r in results.items()] == [("supported", "skip")]
    assert "needs hardware nobody has" in results["supported"].reason

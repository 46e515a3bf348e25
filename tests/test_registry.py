"""registry.choose: forcing, priority, ties, clashes, records, lazy factories."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascend_kernel.errors import KernelError, PluginError, SelectionError
from ascend_kernel.registry import Implementation, check_unique_names, choose

CTX = SimpleNamespace(flavour="plain")
SETTING = "ASCEND_KERNEL_SAMPLER"


def impl(name, priority=0, supports=None, plugin=None, factory=None, aliases=(), family="sampler"):
    entry = Implementation(
        family=family,
        name=name,
        factory=factory if factory is not None else (lambda ctx, n=name: ("built", n, ctx)),
        priority=priority,
        aliases=aliases,
        **({"supports": supports} if supports is not None else {}),
    )
    plugin = plugin or f"plug-{name}"
    return entry.with_origin(plugin, f"ascend_kernel.plugins: {plugin} = pkg.{plugin.replace('-', '_')}")


def unsupported(reason):
    return lambda ctx: reason


def run(entries, forced=None, **kw):
    return choose("sampler", entries, CTX, forced=forced, forcing_setting=SETTING, **kw)


def reasons(record):
    return {c.name: c.reason for c in record.candidates}


# -- forcing -----------------------------------------------------------------------


def test_forced_name_wins_over_priority():
    entries = [impl("high", 100), impl("low", 1)]
    chosen, record = run(entries, forced="low")
    assert chosen.name == "low"
    assert record.chosen == "low"
    assert record.forced_by == f"setting {SETTING}=low"
    assert reasons(record) == {"low": "chosen", "high": f"not the forced name ({SETTING}=low)"}


def test_forced_alias_matches():
    chosen, record = run([impl("real-name", aliases=("Nick_Name",)), impl("other", 5)], forced="nick-name")
    assert chosen.name == "real-name"
    assert record.plugin == "plug-real-name"


def test_forced_unknown_lists_known_names_and_setting():
    with pytest.raises(SelectionError) as info:
        run([impl("beta"), impl("alpha")], forced="gamma")
    msg = str(info.value)
    assert "'gamma'" in msg and SETTING in msg
    assert "alpha, beta" in msg


def test_forced_unknown_with_nothing_installed():
    with pytest.raises(SelectionError, match="none installed"):
        run([], forced="x")


def test_forced_but_unsupported_gives_reason_and_origin():
    entries = [impl("picky", supports=unsupported("needs an A3 SoC")), impl("other", 3)]
    with pytest.raises(SelectionError) as info:
        run(entries, forced="picky")
    msg = str(info.value)
    assert "needs an A3 SoC" in msg
    assert SETTING in msg
    assert "plugin 'plug-picky'" in msg


# -- automatic choice ----------------------------------------------------------------


def test_auto_picks_highest_priority_supported():
    entries = [
        impl("best-but-unsupported", 100, supports=unsupported("no NPU")),
        impl("mid", 10),
        impl("low", 1),
    ]
    chosen, record = run(entries)
    assert chosen.name == "mid"
    assert record.forced_by == "highest priority (10)"
    assert reasons(record) == {
        "best-but-unsupported": "unsupported: no NPU",
        "mid": "chosen",
        "low": "lower priority (1 < 10)",
    }
    assert [c.chosen for c in record.candidates] == [False, True, False]
    assert [c.priority for c in record.candidates] == [100, 10, 1]


def test_only_supported_candidate():
    chosen, record = run([impl("a", 5, supports=unsupported("nope")), impl("b", 0)])
    assert chosen.name == "b"
    assert record.forced_by == "only supported candidate"


def test_negative_priorities_order():
    chosen, _ = run([impl("a", -5), impl("b", -1)])
    assert chosen.name == "b"


def test_tie_at_top_names_both():
    with pytest.raises(SelectionError) as info:
        run([impl("one", 7), impl("two", 7), impl("three", 1)])
    msg = str(info.value)
    assert "tie at priority 7" in msg
    assert "one (plugin 'plug-one'" in msg and "two (plugin 'plug-two'" in msg
    assert "three" not in msg
    assert SETTING in msg


def test_tie_below_top_is_fine():
    chosen, _ = run([impl("top", 9), impl("x", 1), impl("y", 1)])
    assert chosen.name == "top"


def test_tie_resolved_by_forcing():
    chosen, _ = run([impl("one", 7), impl("two", 7)], forced="two")
    assert chosen.name == "two"


def test_nothing_supported_lists_each_reason():
    entries = [impl("a", supports=unsupported("reason A")), impl("b", supports=unsupported("reason B"))]
    with pytest.raises(SelectionError) as info:
        run(entries, subject="FullAttentionSpec")
    msg = str(info.value)
    assert "sampler for FullAttentionSpec" in msg
    assert "a (plugin 'plug-a'" in msg and "reason A" in msg
    assert "b (plugin 'plug-b'" in msg and "reason B" in msg


def test_nothing_installed_required_family():
    with pytest.raises(SelectionError, match="none installed"):
        run([])


def test_optional_family_unused_has_record():
    entries = [impl("a", supports=unsupported("no speculative decoding configured"))]
    chosen, record = run(entries, optional=True)
    assert chosen is None
    assert record.chosen is None and record.plugin is None and record.entry_point is None
    assert record.forced_by.startswith("unused:")
    assert "no speculative decoding configured" in record.forced_by
    assert reasons(record) == {"a": "unsupported: no speculative decoding configured"}
    assert record.as_dict()["candidates"][0]["chosen"] is False


def test_optional_family_with_nothing_installed():
    chosen, record = run([], optional=True)
    assert chosen is None and record.candidates == ()
    assert "none installed" in record.forced_by


def test_ctx_reaches_supports():
    seen = []
    entries = [impl("a", supports=lambda ctx: seen.append(ctx) or None)]
    run(entries)
    assert seen == [CTX]


# -- name clashes --------------------------------------------------------------------


def test_duplicate_names_across_plugins_name_both():
    entries = [impl("same", plugin="first"), impl("same", plugin="second")]
    with pytest.raises(SelectionError) as info:
        run(entries)
    msg = str(info.value)
    assert "'same' is provided by plugin 'first'" in msg
    assert "plugin 'second'" in msg
    assert "ASCEND_KERNEL_DISABLE_PLUGINS" in msg


def test_names_normalise_before_clash_check():
    entries = [impl("Fast_Sampler", plugin="first"), impl("fast-sampler", plugin="second")]
    with pytest.raises(SelectionError, match="'fast-sampler' is provided by"):
        run(entries)


def test_alias_clashing_with_other_name():
    entries = [impl("alpha", plugin="first"), impl("beta", aliases=("alpha",), plugin="second")]
    with pytest.raises(SelectionError) as info:
        check_unique_names("sampler", entries)
    assert "plugin 'first'" in str(info.value) and "plugin 'second'" in str(info.value)


def test_clash_detected_even_when_forced_elsewhere():
    entries = [impl("x", plugin="p1"), impl("x", plugin="p2"), impl("y")]
    with pytest.raises(SelectionError, match="Duplicate sampler"):
        run(entries, forced="y")


# -- failing plugin code ---------------------------------------------------------------


def test_supports_that_raises_names_plugin_and_entry_point():
    def boom(ctx):
        raise KeyError("model_config")

    entries = [impl("ok"), impl("broken", supports=boom, plugin="badplug")]
    with pytest.raises(PluginError) as info:
        run(entries)
    msg = str(info.value)
    assert "'broken'" in msg
    assert "plugin 'badplug'" in msg
    assert "ascend_kernel.plugins: badplug = pkg.badplug" in msg
    assert "KeyError" in msg
    assert isinstance(info.value, KernelError)


def test_factory_that_raises_names_plugin():
    def factory(ctx):
        raise RuntimeError("out of memory")

    chosen, _ = run([impl("fragile", factory=factory, plugin="fragile-plug")])
    with pytest.raises(PluginError) as info:
        chosen.build(CTX)
    msg = str(info.value)
    assert "'fragile'" in msg and "plugin 'fragile-plug'" in msg and "RuntimeError: out of memory" in msg


# -- factories --------------------------------------------------------------------------


def test_callable_factory_gets_ctx():
    chosen, _ = run([impl("a")])
    assert chosen.build(CTX) == ("built", "a", CTX)


def test_lazy_module_class_method_factory():
    entry = Implementation(
        family="attention_state",
        name="standard",
        factory="ascend_kernel_plugins.attention.states:StandardStatePolicy.from_context",
    )
    from ascend_kernel_plugins.spec_decode.eagle import EagleDrafter

    ctx = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(enable_chunked_prefill=True)),
                          chosen={"drafter": EagleDrafter()})
    built = entry.build(ctx)
    from ascend_kernel_plugins.attention.states import AttentionState, StandardStatePolicy

    assert isinstance(built, StandardStatePolicy)
    assert built.verify_state is AttentionState.ChunkedPrefill and built.chunked_prefill is True


def test_lazy_module_attr_factory():
    entry = Implementation(family="f", name="n", factory="builtins:type")
    assert entry.build(CTX) is SimpleNamespace


def test_lazy_factory_bad_path_names_plugin():
    entry = Implementation(family="f", name="n", factory="no_such_module_xyz:thing").with_origin(
        "ghost", "ascend_kernel.plugins: ghost = ghost_mod"
    )
    with pytest.raises(PluginError, match=r"plugin 'ghost' \(ascend_kernel.plugins: ghost = ghost_mod\).*"
                                          r"ModuleNotFoundError"):
        entry.build(CTX)
    entry = Implementation(family="f", name="n", factory="types:NoSuchAttr.x").with_origin("ghost", "ep")
    with pytest.raises(PluginError, match="AttributeError"):
        entry.build(CTX)


def test_implementation_normalises_names_and_origin():
    entry = Implementation(family="f", name=" My_Impl ", factory=lambda c: c, aliases=("Old_Name",))
    assert entry.name == "my-impl" and entry.aliases == ("old-name",)
    assert entry.origin == "an unnamed plugin"
    stamped = entry.with_origin("p", "ep-string")
    assert stamped.origin == "plugin 'p' (ep-string)"
    assert entry.plugin == ""  # with_origin returns a copy


def test_record_as_dict_round_trip():
    _, record = run([impl("a", 2), impl("b", 1)])
    d = record.as_dict()
    assert d["family"] == "sampler" and d["chosen"] == "a" and d["plugin"] == "plug-a"
    assert d["entry_point"] == "ascend_kernel.plugins: plug-a = pkg.plug_a"
    assert [c["name"] for c in d["candidates"]] == ["a", "b"]
    assert d["candidates"][1]["reason"] == "lower priority (1 < 2)"

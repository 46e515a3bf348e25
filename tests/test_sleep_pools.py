"""The sleep-mode pools and controller against an independent model of their semantics.

The oracle is plain Python and numpy: per tag a state, per tensor the values it must hold once resident
again (unchanged when offloaded or preserved, zeros when discarded, whatever was last written while
resident). Random operation sequences (derandomized) run on real tensors — tied parameters, views that
share one backing buffer, a preserved buffer — and after every step the pools must agree with the model:
freed storages hold zero bytes, restored ones hold exactly the model's values, views still alias their base.
The controller is checked on a real ``nn.Module`` and a real KV buffer behind a minimal worker.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from ascend_kernel_plugins.sleep_mode.controller import SleepController
from ascend_kernel_plugins.sleep_mode.plugin import ascend_kernel_sleep_mode, pools_for
from ascend_kernel_plugins.sleep_mode.pools import TaggedPools


def _world():
    """Tensors as a model and a KV cache hold them: a tied weight, a buffer, one KV buffer viewed per layer."""
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(8, 4, generator=g)
    tensors = {
        "embed": embed,
        "lm_head": embed.view(8, 4),  # tied: another tensor object on the same storage
        "proj": torch.randn(4, 4, generator=g, dtype=torch.float64),
        "rope": torch.randn(16, generator=g).to(torch.bfloat16),  # a buffer: kept across a discard
    }
    kv = torch.randn(2, 3, 5, generator=g)
    tensors["kv0"], tensors["kv1"] = kv[0], kv[1]  # views sharing one storage
    return tensors, kv


TAG_OF = {"embed": "weights", "lm_head": "weights", "proj": "weights", "rope": "weights", "kv0": "kv_cache",
          "kv1": "kv_cache"}


def _register(pools: TaggedPools, tensors: dict[str, torch.Tensor]) -> None:
    pools.register("weights", [("rope", tensors["rope"])], preserve=True)
    pools.register("weights", [(n, tensors[n]) for n in ("embed", "lm_head", "proj", "rope")])
    pools.register("kv_cache", [("kv0", tensors["kv0"]), ("kv1", tensors["kv1"])])


def _values(t: torch.Tensor) -> np.ndarray:
    # a copy first: a tensor handed to numpy makes its storage non-resizable (numpy would dangle)
    return t.detach().to(torch.float64, copy=True).numpy()


OPS = st.lists(st.tuples(st.sampled_from(["offload", "discard", "restore", "write"]),
                         st.sampled_from(["weights", "kv_cache"])), min_size=1, max_size=12)


@fuzz(60)
@given(ops=OPS)
def test_operation_sequences_match_the_model(ops):
    tensors, kv = _world()
    pools = TaggedPools()
    _register(pools, tensors)
    expected = {n: _values(t) for n, t in tensors.items()}
    state = {"weights": "resident", "kv_cache": "resident"}
    preserved = {"rope"}
    for op, tag in ops:
        names = [n for n, t in TAG_OF.items() if t == tag]
        if op == "write":
            if state[tag] != "resident":
                continue
            for name in names:
                if name != "lm_head":  # the tied twin changes with embed
                    tensors[name].add_(1)
            # (never read a freed storage: its tensors point at zero bytes, as unmapped device memory would)
            expected.update({n: _values(tensors[n]) for n, t in TAG_OF.items() if state[t] == "resident"})
        elif op in ("offload", "discard"):
            if state[tag] != "resident":
                with pytest.raises(ValueError, match="already"):
                    getattr(pools, op)(tag)
                continue
            getattr(pools, op)(tag)
            state[tag] = "offloaded" if op == "offload" else "discarded"
            if op == "discard":
                for name in names:
                    if name not in preserved:
                        expected[name] = np.zeros_like(expected[name])
        else:
            pools.restore(tag)
            state[tag] = "resident"
        for t, s in state.items():
            assert pools.state(t) == s
        for name, owner in TAG_OF.items():
            if state[owner] == "resident":
                np.testing.assert_array_equal(_values(tensors[name]), expected[name], err_msg=name)
            else:
                assert tensors[name].untyped_storage().nbytes() == 0, name
    if state["kv_cache"] == "resident":  # the per-layer views still alias the one backing buffer
        kv[1].fill_(7)
        assert bool((tensors["kv1"] == 7).all())
    if state["weights"] == "resident":  # the tied twin still aliases embed's storage, not a copy of it
        tensors["embed"].fill_(3)
        assert bool((tensors["lm_head"] == 3).all())


def test_sizes_count_shared_storages_once():
    tensors, kv = _world()
    pools = TaggedPools()
    _register(pools, tensors)
    assert pools.bytes("kv_cache") == kv.numel() * 4
    assert pools.bytes("weights") == 8 * 4 * 4 + 4 * 4 * 8 + 16 * 2
    assert pools.describe()["weights"] == {"state": "resident", "bytes": pools.bytes("weights"), "storages": 3}
    assert pools.discard("kv_cache") == kv.numel() * 4
    assert pools.restore("kv_cache") == kv.numel() * 4 and pools.restore("kv_cache") == 0  # resident: nothing to do


def test_bad_requests_are_refused_before_anything_changes():
    tensors, _ = _world()
    pools = TaggedPools()
    with pytest.raises(ValueError, match="unknown sleep-mode tag 'activations'; allowed: weights, kv_cache"):
        pools.register("activations", [("x", tensors["proj"])])
    _register(pools, tensors)
    with pytest.raises(ValueError, match="already in the pool of tag 'weights'"):
        pools.register("kv_cache", [("proj", tensors["proj"])])
    borrowed = torch.frombuffer(bytearray(64), dtype=torch.float32)
    with pytest.raises(ValueError, match="'mapped' has a storage that cannot be resized"):
        pools.register("weights", [("fresh", torch.ones(3)), ("mapped", borrowed)])
    assert pools.describe()["weights"]["storages"] == 3  # the good tensor of the refused call was not added
    pools.discard("kv_cache")
    with pytest.raises(ValueError, match="not resident"):
        pools.register("weights", [("late", torch.ones(2))])
    np_shared = torch.ones(4)
    fixed = TaggedPools()
    fixed.register("kv_cache", [("shared", np_shared)])
    np_shared.numpy()  # from here on torch refuses to resize the storage
    with pytest.raises(ValueError, match=r"the storages of \['shared'\] can no longer be resized"):
        fixed.discard("kv_cache")
    assert fixed.state("kv_cache") == "resident" and np_shared.tolist() == [1.0] * 4
    with pytest.raises(ValueError, match="no tensors are registered under tag"):
        TaggedPools().restore("weights")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1)
        self.norm = torch.nn.Parameter(torch.full((4,), 2.0))
        self.register_buffer("cos_sin", torch.linspace(1, 2, 8))


def _worker(graph: str = "eager", keep: list[str] | None = None):
    model = _Model()
    runner = SimpleNamespace(get_model=lambda: model, kv_caches=[torch.ones(2, 64), [torch.ones(3)]],
                             device=torch.device("cpu"),
                             kernel=SimpleNamespace(records=[SimpleNamespace(family="graph", chosen=graph)]))
    config = SimpleNamespace(model_config=SimpleNamespace(sleep_preserve_parameter_names=keep or []),
                             kv_transfer_config=None)
    return SimpleNamespace(model_runner=runner, vllm_config=config), model


def test_controller_levels_on_a_host():
    worker, model = _worker(keep=["norm"])
    controller = ascend_kernel_sleep_mode(worker)
    assert ascend_kernel_sleep_mode(worker) is controller  # one per worker: it holds what is asleep
    kv = worker.model_runner.kv_caches
    controller.sleep(1)
    assert controller.describe()["pools"]["weights"]["state"] == "resident"  # a host is where offload would go
    assert kv[0].untyped_storage().nbytes() == 0 and kv[1][0].untyped_storage().nbytes() == 0
    controller.wake_up(None)
    assert bool((kv[0] == 0).all()) and controller.level is None  # the KV memory comes back zero-filled
    controller.sleep(2)
    assert model.embed.untyped_storage().nbytes() == 0
    controller.wake_up(["weights"])
    assert bool((model.embed == 0).all())  # dropped: a checkpoint reload refills it
    assert model.norm.tolist() == [2.0] * 4  # named by sleep_preserve_parameter_names
    assert model.cos_sin.tolist() == torch.linspace(1, 2, 8).tolist()  # buffers are kept
    assert controller.level == 2 and controller.describe()["pools"]["kv_cache"]["state"] == "discarded"
    controller.wake_up(["kv_cache"])
    assert controller.level is None
    controller.discard(("kv_cache",))
    assert kv[0].untyped_storage().nbytes() == 0


def test_controller_refuses_what_it_cannot_keep():
    worker, _ = _worker(graph="aclgraph")
    with pytest.raises(RuntimeError, match="cannot keep graph mode 'aclgraph'.*ASCEND_KERNEL_GRAPH_MODE=eager"):
        SleepController(worker, TaggedPools()).sleep(1)
    worker, model = _worker()
    worker.vllm_config.kv_transfer_config = SimpleNamespace(kv_connector="MooncakeConnectorV1")
    with pytest.raises(RuntimeError, match="engine with a KV connector"):
        SleepController(worker, TaggedPools()).sleep(1)
    worker.vllm_config.kv_transfer_config = None
    controller = SleepController(worker, TaggedPools())
    with pytest.raises(ValueError, match="sleep level 3 .* allowed: 1, 2"):
        controller.sleep(3)
    assert model.embed.untyped_storage().nbytes() == 48  # nothing was freed
    worker.model_runner.kv_caches = []
    with pytest.raises(RuntimeError, match="no KV cache tensors"):
        controller.sleep(1)
    worker.model_runner.kv_caches = [torch.frombuffer(bytearray(16), dtype=torch.float32)]  # not torch's to free
    with pytest.raises(ValueError, match="cannot be resized"):
        controller.sleep(1)
    assert controller.pools.tags() == [] and model.embed.untyped_storage().nbytes() == 48  # all or nothing


def test_the_provider_follows_the_device():
    """The host's provider here; ``pools_for("npu")`` runs on the stand-in NPU (tests/npu/test_sleep_npu.py)."""
    assert type(pools_for("cpu")) is TaggedPools

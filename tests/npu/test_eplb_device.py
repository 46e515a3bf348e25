"""EPLB's weight moves on the stand-in NPU: device tensors, moved over the EP group's device group (HCCL).

The path an NPU runs: the EPLB plugin's admission names vLLM's ``torch_nccl``
communicator for an NPU (``communicator_for(config, "npu")``); vLLM's
``EplbState.add_model`` builds it with ``create_eplb_communicator`` over the
EP group coordinator, which takes the ``device_group`` because the weights
are device tensors; the kernel's :class:`KernelEplbState` then moves the
weights, either replaying a recorded map at start (``_replay``) or
rearranging on the measured load (vLLM's ``rearrange``: the load all-reduced
over the device group, the policy, ``rearrange_expert_weights_inplace``).

Here the ranks are threads, each with its own coordinator whose
``device_group`` is a :class:`npu.standin_hccl.StandinHcclGroup` of one
in-process world (world 1: every move is a local copy; world 2: experts cross
ranks). The coordinator's ``cpu_group`` is None: a move that took the gloo
group instead would fail, and the stand-in device refuses any gloo
collective on its tensors anyway. Each expert's weights (int8 rows, their
float32 scales, bfloat16 rows: the forms the NPU provider's experts hold) are
a function of the logical expert, so after the move every physical slot must
hold exactly the logical expert that the new map names; the maps vLLM's
layers read must match; and the fabric must have carried the cross-rank
experts (device to device) and nothing at world 1.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch

from npu.standin import DEVICE, NpuTensor, host, npu
from npu.standin_hccl import Fabric, run_ranks

LOGICAL, REDUNDANT, LAYERS, ROWS = 4, 2, 2, 5
PHYSICAL = LOGICAL + REDUNDANT
#: a replayed placement: expert 3 and 0 swap ranks, 1 and 2 get the replicas (vLLM's default is 0..3, 0, 1)
REPLAYED = [[3, 1, 2, 0, 1, 2], [2, 3, 1, 0, 3, 2]]


def expert_rows(layer: int, logical: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weights logical expert ``logical`` of layer ``layer`` holds: int8 rows, float32 scales, bf16 rows."""
    g = torch.Generator().manual_seed(100 * layer + logical)
    return (torch.randint(-128, 127, (2 * ROWS, 8), generator=g, dtype=torch.int8).flatten(),
            torch.rand(2 * ROWS, generator=g) + logical,
            torch.randn(ROWS, 4, generator=g).to(torch.bfloat16).flatten())


def placed(placement: list[int], layer: int, rank: int, world: int) -> list[torch.Tensor]:
    """A rank's expert tensors ``[local, ...]`` (vLLM's ``expert_weights`` rows) for a layer's placement, on host."""
    local = PHYSICAL // world
    mine = placement[rank * local:(rank + 1) * local]
    return [torch.stack(parts) for parts in zip(*(expert_rows(layer, e) for e in mine))]


class TinyMoE:
    """What vLLM's ``EplbState`` reads of a ``MixtureOfExperts`` model, its expert weights on the stand-in NPU."""

    def __init__(self, rank: int, world: int) -> None:
        self.num_moe_layers, self.num_expert_groups = LAYERS, 1
        self.num_logical_experts = self.num_routed_experts = LOGICAL
        self.num_physical_experts, self.num_redundant_experts = PHYSICAL, REDUNDANT
        self.num_local_physical_experts = PHYSICAL // world
        initial = list(range(LOGICAL)) + list(range(REDUNDANT))  # vLLM's initial placement
        self.expert_weights = [[npu(t) for t in placed(initial, layer, rank, world)] for layer in range(LAYERS)]
        self.moe_layers: list = []

    def set_eplb_state(self, load_pass: torch.Tensor, logical_to_physical: torch.Tensor,
                       replica_count: torch.Tensor) -> None:
        self.maps = (load_pass, logical_to_physical, replica_count)


@pytest.fixture
def ep_world(monkeypatch):
    """``world`` -> (groups, coordinator per thread): vLLM's EP group getters answer each rank's own coordinator."""
    from vllm.distributed import parallel_state
    from vllm.distributed.eplb import eplb_state

    mine = threading.local()
    for module, name in ((eplb_state, "get_ep_group"), (eplb_state, "get_eplb_group"),
                         (parallel_state, "get_ep_group")):
        monkeypatch.setattr(module, name, lambda: mine.coordinator)
    monkeypatch.setattr(eplb_state, "get_node_count", lambda: 1)

    def enter(rank: int, group: object, world: int) -> None:
        mine.coordinator = SimpleNamespace(device_group=group, cpu_group=None, rank_in_group=rank, world_size=world)

    return enter


def _state(world: int, replay: str = "") -> tuple:
    from vllm.config import EPLBConfig

    from ascend_kernel_plugins.eplb.admission import communicator_for
    from ascend_kernel_plugins.eplb.policies import DefaultPolicy
    from ascend_kernel_plugins.eplb.state import KernelEplbState

    config = EPLBConfig(window_size=2, step_interval=1, num_redundant_experts=REDUNDANT, use_async=False)
    config.communicator = communicator_for(config, "npu")[0]  # what the plugin's admission sets on an NPU
    parallel = SimpleNamespace(eplb_config=config, enable_elastic_ep=False, num_ubatches=0)
    return KernelEplbState(parallel, DEVICE, DefaultPolicy(), world, replay_path=replay), \
        SimpleNamespace(compute_hash=lambda: "tiny-moe", model="tiny-moe")


def _slots_hold(model: TinyMoE, placement: list[list[int]], rank: int, world: int) -> bool:
    return all(torch.equal(host(moved), want) for layer in range(LAYERS)
               for moved, want in zip(model.expert_weights[layer], placed(placement[layer], layer, rank, world)))


@pytest.mark.parametrize("world", [1, 2])
def test_a_replayed_map_moves_device_weights_over_the_device_group(ep_world, world, tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"physical_to_logical": REPLAYED}))
    fabric = Fabric(world)

    def rank(r: int) -> dict:
        ep_world(r, groups[r], world)
        state, model_config = _state(world, str(path))
        model = TinyMoE(r, world)
        state.add_model(model, model_config)
        model_state = state._model_state()
        assert type(model_state.communicator).__name__ == "TorchDistNcclEplbCommunicator"
        assert isinstance(model_state.physical_to_logical_map, NpuTensor)
        return {"held": _slots_hold(model, REPLAYED, r, world), "map": host(model_state.physical_to_logical_map),
                "replicas": host(model.maps[2]), "moved": state.report["moved_experts"]}

    with fabric.groups() as groups:
        out = run_ranks(world, rank)
    initial = torch.tensor([list(range(LOGICAL)) + list(range(REDUNDANT))] * LAYERS)
    for r in range(world):
        assert out[r]["held"], f"rank {r}'s slots do not hold the replayed map's experts"
        assert out[r]["map"].tolist() == REPLAYED
        assert out[r]["replicas"].tolist() == [[sum(row.count(e) for row in [layer]) for e in range(LOGICAL)]
                                               for layer in REPLAYED]
        assert out[r]["moved"] == int((initial != torch.tensor(REPLAYED)).sum())
    crossed = [(src, dst) for src, dst, _ in fabric.sent]
    if world == 1:
        assert crossed == []  # every move is a copy between this rank's own slots
    else:  # e.g. layer 0: rank 0 needs expert 3, only rank 1 holds it (3 tensors per expert)
        assert (1, 0) in crossed and (0, 1) in crossed and len(crossed) % 3 == 0


def test_a_rearrangement_all_reduces_the_load_and_moves_over_the_device_group(ep_world, monkeypatch):
    """vLLM's ``rearrange`` through the kernel's state, at 2 ranks: each rank saw half the load, the sum decides.

    vLLM times the move with ``torch.Event(enable_timing=True)`` on rank 0. torch_npu's events do that on an
    NPU; the stand-in's device guard (torch's Python backend API) can record an event but neither synchronize
    nor time one, so for this test ``torch.Event`` is the EPLB plugin's host event (the subject is the move)."""
    from ascend_kernel_plugins.eplb.state import HostEvent

    monkeypatch.setattr(torch, "Event", HostEvent)
    world = 2
    fabric = Fabric(world)
    # each rank's own measured load [layers, physical] (under vLLM's initial map 0..3, 0, 1): they disagree
    seen = [torch.tensor([[0, 50, 40, 1, 0, 30], [2, 0, 0, 60, 1, 0]], dtype=torch.int32),
            torch.tensor([[70, 0, 0, 0, 5, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)]

    def rank(r: int) -> dict:
        ep_world(r, groups[r], world)
        state, model_config = _state(world)
        model = TinyMoE(r, world)
        state.add_model(model, model_config)
        model_state = state._model_state()
        model_state.expert_load_window.copy_(npu(seen[r].expand(2, -1, -1).contiguous()))  # a window of 2 steps
        state.rearrange()
        new = host(model_state.physical_to_logical_map).tolist()
        return {"map": new, "held": _slots_hold(model, new, r, world), "report": dict(state.report)}

    with fabric.groups() as groups:
        out = run_ranks(world, rank)
    # the oracle: vLLM's default policy on the load summed over both ranks and the window, per logical expert
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    initial = torch.tensor([list(range(LOGICAL)) + list(range(REDUNDANT))] * LAYERS)
    logical = torch.zeros(LAYERS, LOGICAL, dtype=torch.int64).scatter_add_(1, initial, 2 * (seen[0] + seen[1]).long())
    want = DefaultEplbPolicy.rebalance_experts(logical, PHYSICAL, 1, 1, world, initial)
    want = want.tolist()
    for r in range(world):
        assert out[r]["map"] == want, (r, out[r]["map"], want)  # one decision, from the all-reduced load
        assert out[r]["held"], f"rank {r}'s slots do not hold the new map's experts"
        assert out[r]["report"]["rebalances"] == 1 and out[r]["report"]["moved_experts"] > 0
    assert want != initial.tolist()
    assert any(src != dst for src, dst, _ in fabric.sent)


def test_the_device_group_refuses_host_tensors():
    """HCCL moves device memory: a host tensor handed to the device group fails (the fake is not lenient)."""
    with Fabric(2).groups() as groups:
        with pytest.raises(RuntimeError, match="device group takes npu tensors only"):
            groups[0].send([torch.ones(3)], 1, 0)
        with pytest.raises(RuntimeError, match="device group takes npu tensors only"):
            torch.distributed.all_reduce(torch.ones(3), group=groups[0])

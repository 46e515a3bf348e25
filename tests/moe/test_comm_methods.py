"""The four MoE comm methods on two real gloo ranks (no vLLM), against a dense all-experts-local MoE.

Both ranks run every scenario in one spawned job (start-up is the slow part)
and save what they computed; the assertions run here, in the test process,
against a float64 dense MoE written below (per token, per chosen expert:
weight * down(silu(gate x) * up x)). Two token layouts are covered: the
tensor-parallel form (both ranks hold the same batch, their outputs are
partial and summed by an all-reduce, as vLLM's TP all-reduce does) and the
data-parallel form (each rank its own batch of its own size, outputs final).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gloo_ranks import run_ranks as run_worker_ranks

WORLD = 2
EXPERTS, TOP_K, HIDDEN, INTER = 8, 2, 16, 12
THIRDPARTY = Path(__file__).resolve().parents[1] / "thirdparty"
#: the built-ins, and a third party's method (tests/thirdparty/ak_moe_plugin) held to the same oracle
METHODS = ("allgather", "alltoall", "mc2", "naive_multicast", "shard-allgather")
#: expert -> owning rank per placement; "swapped" moves experts 1 and 6 to the other rank
PLACEMENTS = {"linear": [0, 0, 0, 0, 1, 1, 1, 1], "round_robin": [0, 1, 0, 1, 0, 1, 0, 1]}


def weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN ** 0.5  # vLLM layout: gate rows, then up
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER ** 0.5
    return w13, w2


def batch(tokens: int, seed: int, avoid: tuple[int, ...] = (), skew: bool = False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    allowed = [e for e in range(EXPERTS) if e not in avoid]
    ids = torch.empty(tokens, TOP_K, dtype=torch.int64)
    for t in range(tokens):
        if skew and t % 3:
            ids[t] = torch.tensor(allowed[:TOP_K])  # most tokens pile onto the first experts
        else:
            ids[t] = torch.tensor(allowed)[torch.randperm(len(allowed), generator=gen)[:TOP_K]]
    w = torch.rand(tokens, TOP_K, generator=gen) + 0.1
    return x, w, ids


#: name -> (tokens on rank 0, tokens on rank 1, batch options); the TP form uses rank 0's batch on both ranks
SCENARIOS = {
    "random": (7, 5, {}),
    "zero_load": (6, 3, {"avoid": (2, 5)}),
    "uneven": (9, 4, {"skew": True}),
    "one_token": (1, 2, {}),
    "empty": (0, 0, {}),
}


def dense_moe(x, w, ids) -> torch.Tensor:
    w13, w2 = (t.double() for t in weights())
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            e = int(ids[t, j])
            gate, up = (w13[e] @ x[t].double()).split(INTER)
            out[t] += float(w[t, j]) * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def _worker(rank: int, port: int, out_dir: str, broken: str) -> None:
    import sys

    import torch.distributed as dist

    sys.path.insert(0, str(THIRDPARTY))
    from ak_moe_plugin import ShardAllGather

    from ascend_kernel.ops.reference import ReferenceOps
    from ascend_kernel.ops.moe_experts import LocalExperts, gather_expert_maps, slot_table
    from ascend_kernel_plugins.moe_comm.methods.allgather import AllGatherMethod
    from ascend_kernel_plugins.moe_comm.methods.alltoall import AllToAllMethod
    from ascend_kernel_plugins.moe_comm.methods.base import CapacityError
    from ascend_kernel_plugins.moe_comm.methods.mc2 import MC2Method
    from ascend_kernel_plugins.moe_comm.methods.naive_multicast import NaiveMulticastMethod
    from ascend_kernel.ops.moe_parallel import MoEParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    world = dist.group.WORLD
    ops = ReferenceOps()
    methods = {"allgather": AllGatherMethod(ops), "alltoall": AllToAllMethod(ops), "mc2": MC2Method(ops, 64),
               "naive_multicast": NaiveMulticastMethod(ops), "shard-allgather": ShardAllGather(ops)}
    w13, w2 = weights()
    results: dict = {}
    for placement, owners in PLACEMENTS.items():
        mine = [e for e in range(EXPERTS) if owners[e] == rank]
        expert_map = torch.full((EXPERTS,), -1, dtype=torch.int64)
        expert_map[mine] = torch.arange(len(mine))
        maps = gather_expert_maps(expert_map, EXPERTS, world, WORLD)
        slots = slot_table(maps, len(mine))
        if broken == "swap_owners":  # experts 0 and 7 trade slots: tokens reach the wrong weights
            slots[[0, 7]] = slots[[7, 0]]
        experts = LocalExperts(w13[mine].transpose(1, 2).contiguous(), w2[mine].transpose(1, 2).contiguous(),
                               slots, len(mine), ops)
        tp_form = MoEParallel(world, rank, WORLD, rank, WORLD)
        dp_form = MoEParallel(world, rank, WORLD, 0, 1, token_group=world, token_rank=rank, token_size=WORLD)
        for scenario, (n0, n1, options) in SCENARIOS.items():
            for form, parallel in (("tp", tp_form), ("dp", dp_form)):
                n, seed = (n0, 0) if form == "tp" or rank == 0 else (n1, 1)
                x, w, ids = batch(n, seed, **options)
                if broken == "drop_weights":
                    w = torch.ones_like(w)
                for name, method in methods.items():
                    dispatched = method.dispatch(x, w, ids, experts, parallel)
                    out = method.combine(experts.mlp(dispatched.rows, dispatched.counts), dispatched)
                    if form == "tp":
                        dist.all_reduce(out)
                    results[(placement, scenario, form, name)] = (out, int(dispatched.counts.sum()))
    # capacity: 6 tokens over two shards is 3 per rank, one more than a capacity of 4 allows
    x, w, ids = batch(6, 0)
    try:
        MC2Method(ops, 4).dispatch(x, w, ids, experts, MoEParallel(world, rank, WORLD, rank, WORLD))
        results["refused"] = None
    except CapacityError as exc:
        results["refused"] = str(exc)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_ranks(tmp_path: Path, broken: str = "") -> list[dict]:
    return run_worker_ranks(_worker, WORLD, tmp_path, broken)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(tmp_path_factory.mktemp("moe_ranks"))


def expected(scenario: str, form: str, rank: int) -> torch.Tensor:
    n0, n1, options = SCENARIOS[scenario]
    n, seed = (n0, 0) if form == "tp" or rank == 0 else (n1, 1)
    return dense_moe(*batch(n, seed, **options))


#: the third party's method serves the layout vLLM gives a method (every EP rank holds the same batch) only
CASES = [(m, f) for m in METHODS for f in ("tp", "dp") if (m, f) != ("shard-allgather", "dp")]


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("method", "form"), CASES)
def test_method_equals_dense_moe(ranks, method, form, scenario, placement):
    for rank, results in enumerate(ranks):
        out, _ = results[(placement, scenario, form, method)]
        torch.testing.assert_close(out.double(), expected(scenario, form, rank), rtol=1e-5, atol=1e-5)


def test_every_rank_computes_its_share_of_the_pairs(ranks):
    """Counts prove tokens moved: in the TP form the two ranks' experts split all (token, expert) pairs."""
    x, w, ids = batch(SCENARIOS["random"][0], 0)
    owners = torch.tensor(PLACEMENTS["linear"])[ids]
    for method in METHODS:
        per_rank = [results[("linear", "random", "tp", method)][1] for results in ranks]
        assert per_rank == [int((owners == r).sum()) for r in range(WORLD)], method
        assert all(n > 0 for n in per_rank), method


def test_methods_agree_with_each_other(ranks):
    for results in ranks:
        for key in [k for k in results if isinstance(k, tuple) and k[3] == "allgather"]:
            for method in [m for m in METHODS[1:] if (m, key[2]) in CASES]:
                torch.testing.assert_close(results[(*key[:3], method)][0], results[key][0], rtol=1e-6, atol=1e-6)


def test_mc2_refuses_a_batch_over_capacity(ranks):
    for results in ranks:
        assert results["refused"] is not None and "at most 4 tokens" in results["refused"]


@pytest.mark.parametrize("broken", ["drop_weights", "swap_owners"])
def test_breaking_a_method_is_caught(tmp_path, broken):
    """The oracle is sharp: routing weights ignored, or two experts' owners swapped, give other outputs."""
    results = run_ranks(tmp_path, broken)
    wrong = [m for m in METHODS
             if not torch.allclose(results[0][("linear", "random", "tp", m)][0].double(), expected("random", "tp", 0),
                                   rtol=1e-5, atol=1e-5)]
    assert wrong == list(METHODS)

"""The CPU platform's variable-size collectives (DP + EP MoE), on two real gloo ranks, against plain torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gloo_ranks import run_ranks

WORLD = 2
SIZES = [3, 5]  # rows per rank: unequal, as DP ranks' batches are
WIDTH = 4


def rows(rank: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(100 * seed + rank))


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from ascend_kernel.ops.cpu_communicator import KernelCpuCommunicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    comm = KernelCpuCommunicator(dist.group.WORLD, torch.device("cpu"), dist.group.WORLD, unique_name="ep")
    mine = rows(rank, SIZES[rank])
    results = {
        "gathered": comm.all_gatherv(mine, 0, SIZES),
        "gathered_list": comm.all_gatherv([mine, mine[:, :1].long()], 0, SIZES),
        "gathered_dim1": comm.all_gatherv(mine.t().contiguous(), 1, SIZES),
        "scattered": comm.reduce_scatterv(rows(rank, sum(SIZES), seed=1), 0, SIZES),
        "scattered_even": comm.reduce_scatterv(rows(rank, 6, seed=2), 0),
    }
    for name, call in (("bad_gather", lambda: comm.all_gatherv(mine, 0, [4, 4])),
                       ("bad_scatter", lambda: comm.reduce_scatterv(rows(rank, 7), 0, [3, 3]))):
        try:
            call()
            results[name] = None
        except ValueError as exc:
            results[name] = str(exc)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_worker, WORLD, tmp_path_factory.mktemp("cpu_comm"))


def test_all_gatherv_concatenates_every_ranks_rows_in_rank_order(ranks):
    everything = torch.cat([rows(r, n) for r, n in enumerate(SIZES)])
    for got in ranks:
        assert torch.equal(got["gathered"], everything)
        assert torch.equal(got["gathered_list"][0], everything)
        assert torch.equal(got["gathered_list"][1], everything[:, :1].long())
        assert torch.equal(got["gathered_dim1"], everything.t())


def test_reduce_scatterv_sums_and_hands_each_rank_its_rows(ranks):
    total = sum(rows(r, sum(SIZES), seed=1) for r in range(WORLD))
    even = sum(rows(r, 6, seed=2) for r in range(WORLD))
    start = 0
    for rank, got in enumerate(ranks):
        assert torch.allclose(got["scattered"], total[start:start + SIZES[rank]])
        assert torch.allclose(got["scattered_even"], even[3 * rank:3 * rank + 3])
        start += SIZES[rank]


def test_sizes_that_do_not_fit_are_refused_by_name(ranks):
    for rank, got in enumerate(ranks):
        assert "all_gatherv: sizes [4, 4]" in got["bad_gather"] and f"rows on rank {rank}" in got["bad_gather"]
        assert "reduce_scatterv: sizes [3, 3] do not add up to 7 rows" in got["bad_scatter"]


SHM_ROWS = 12  # splits over 2 and 3 ranks


def _shm_worker(rank: int, port: int, out_dir: str, world: int, ident: str) -> None:
    """A TP group as vLLM builds it (name "tp", vLLM's ops loaded): vLLM puts it on its shared-memory path."""
    import os

    import torch.distributed as dist
    import vllm._C  # noqa: F401  (registers the shared-memory ops vLLM's communicator looks for)

    from ascend_kernel.ops.cpu_communicator import KernelCpuCommunicator

    os.environ["VLLM_DIST_IDENT"] = ident  # this spawned rank's own environment, gone with it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    comm = KernelCpuCommunicator(dist.group.WORLD, torch.device("cpu"), dist.group.WORLD, unique_name="tp:0")
    mine = rows(rank, SHM_ROWS, seed=3)
    before = mine.clone()
    results = {
        "shared_memory": comm.dist_module is not dist,
        "dim0": comm.reduce_scatter(mine, 0),
        "dim1": comm.reduce_scatter(mine.t().contiguous(), 1),
        "input_untouched": torch.equal(mine, before),
    }
    try:
        comm.reduce_scatter(rows(rank, SHM_ROWS + 1), 0)
        results["uneven"] = None
    except ValueError as exc:
        results["uneven"] = str(exc)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [3])  # TP=2 runs it in every sequence-parallel engine of the suite
def test_shared_memory_reduce_scatter_sums_and_hands_each_rank_its_chunk(world, tmp_path):
    """The exchange over vLLM's shared-memory all-gather (TP - 1 rounds) equals the plain sum's chunks."""
    got = run_ranks(_shm_worker, world, tmp_path, world, f"ak-test-rs-{tmp_path.name}")
    total = sum(rows(r, SHM_ROWS, seed=3) for r in range(world))
    chunk = SHM_ROWS // world
    for rank, result in enumerate(got):
        assert result["shared_memory"], "vLLM did not put the group on its shared-memory path"
        assert torch.allclose(result["dim0"], total[rank * chunk:(rank + 1) * chunk])
        assert torch.allclose(result["dim1"], total.t()[:, rank * chunk:(rank + 1) * chunk])
        assert result["input_untouched"]
        assert f"reduce_scatter: {SHM_ROWS + 1} rows along dim 0 do not split evenly over {world} ranks" \
            in result["uneven"]

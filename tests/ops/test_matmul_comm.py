"""The reference provider's matmul + reduce-scatter and all-gather + matmul on two real gloo ranks.

The oracle is independent of both the seam and the collectives: one full
matmul in float64 on the whole input (what the ranks' column slices add up
to), then the token rows a rank should hold (reduce-scatter) or all of them
(all-gather).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gloo_ranks import run_ranks

WORLD, K, N = 2, 8, 6
TOKENS = (5, 4, 1)  # one pad row; none; rank 1's shard all padding


def _data(tokens: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + tokens)
    return {"x": torch.randn(tokens, K, generator=g, dtype=torch.float64),
            "w": torch.randn(N, K, generator=g, dtype=torch.float64),
            "b": torch.randn(N, generator=g, dtype=torch.float64)}


def _padded(tokens: int) -> int:
    return -(-tokens // WORLD) * WORLD


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from ascend_kernel.ops.reference import ReferenceOps

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    ops, cols, got = ReferenceOps(), slice(rank * K // WORLD, (rank + 1) * K // WORLD), {}
    for tokens in TOKENS:
        d, padded = _data(tokens), _padded(tokens)
        # row-parallel: this rank's input columns and weight columns; the bias joins the sum once
        got[("rs", tokens)] = ops.matmul_reduce_scatter(d["x"][:, cols], d["w"][:, cols], d["b"], None, rank,
                                                        WORLD, padded)
        got[("rs_nobias", tokens)] = ops.matmul_reduce_scatter(d["x"][:, cols], d["w"][:, cols], None, None, rank,
                                                               WORLD, padded)
        # column-parallel after the norm: this rank holds its token shard of x (padding zeros last)
        shard_rows = padded // WORLD
        shard = torch.zeros(shard_rows, K, dtype=torch.float64)
        mine = d["x"][rank * shard_rows:(rank + 1) * shard_rows]
        shard[:mine.shape[0]] = mine
        got[("ag", tokens)] = ops.all_gather_matmul(shard, d["w"], d["b"], None, rank, WORLD, tokens)
    torch.save(got, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_worker, WORLD, tmp_path_factory.mktemp("matmul_comm"))


@pytest.mark.parametrize("tokens", TOKENS)
def test_matmul_reduce_scatter_leaves_each_rank_its_rows_of_the_full_product(ranks, tokens):
    d, padded = _data(tokens), _padded(tokens)
    full = torch.zeros(padded, N, dtype=torch.float64)
    full[:tokens] = d["x"] @ d["w"].T
    rows = padded // WORLD
    for rank, got in enumerate(ranks):
        want = full[rank * rows:(rank + 1) * rows]
        torch.testing.assert_close(got[("rs_nobias", tokens)], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[("rs", tokens)], want + d["b"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tokens", TOKENS)
def test_all_gather_matmul_gives_every_rank_every_token(ranks, tokens):
    d = _data(tokens)
    want = d["x"] @ d["w"].T + d["b"]
    for got in ranks:
        assert got[("ag", tokens)].shape == (tokens, N)
        torch.testing.assert_close(got[("ag", tokens)], want, rtol=1e-12, atol=1e-12)


def test_bad_shapes_and_padding_are_named():
    from ascend_kernel.ops.reference import ReferenceOps

    ops, x, w = ReferenceOps(), torch.zeros(3, 4), torch.zeros(5, 4)
    with pytest.raises(ValueError, match=r"x \(3, 4\) and weight \(5, 3\)"):
        ops.matmul_reduce_scatter(x, torch.zeros(5, 3), None, None, 0, 2, 4)
    with pytest.raises(ValueError, match=r"bias \(4,\) must be \[5\]"):
        ops.matmul_reduce_scatter(x, w, torch.zeros(4), None, 0, 2, 4)
    with pytest.raises(ValueError, match="padded_tokens 3 must be >= the 3 tokens and a multiple of the TP size 2"):
        ops.matmul_reduce_scatter(x, w, None, None, 0, 2, 3)
    with pytest.raises(ValueError, match="padded_tokens 6 must be >= the 7 tokens"):
        ops.all_gather_matmul(x, w, None, None, 0, 2, 7)

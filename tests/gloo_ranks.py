"""Unit tests that need real collectives run a worker per rank over a gloo group: a port, the ranks, their results.

Each worker is a module-level function ``worker(rank, port, out_dir, *args)`` that joins the group at
``tcp://127.0.0.1:port`` and saves its results to ``out_dir/rank{rank}.pt``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable

import torch


def free_port() -> int:
    """A TCP port nobody listens on now (the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_results(out_dir: Path, world: int) -> list[Any]:
    """What each rank saved, in rank order."""
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def run_ranks(worker: Callable[..., None], world: int, out_dir: Path, *args: Any) -> list[Any]:
    """``worker`` on ``world`` spawned processes (each must exit 0), then what each rank saved."""
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(free_port(), str(out_dir), *args), nprocs=world, join=True)
    return rank_results(out_dir, world)

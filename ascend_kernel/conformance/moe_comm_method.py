"""Contract of the ``moe_comm_method`` family: dispatch, the experts, combine == a dense MoE.

A method moves tokens to the experts and back; with the expert MLP between
its ``dispatch`` and ``combine`` the result must be what a dense MoE computes
(per token, per chosen expert: weight x down(silu(gate x) * up x), in
float64 here). The experts run on the reference ops provider, so only the
method is under test.

* ``attributes``: ``name`` is the entry's name; ``capacity`` is None or a
  whole number >= 1; ``fallback`` is None without a capacity and, with one,
  the name of an installed method;
* ``dense-equivalence``: on one rank with every expert local
  (``MoEParallel.single()``), ``combine(experts.mlp(dispatch(x)))`` equals the
  dense MoE for random routing, experts nobody routes to, a skewed load, one
  token and an empty batch (batches never above the method's capacity);
* ``dense-equivalence-2-ranks`` (with ``distributed=True`` / ``--distributed``):
  the same on two gloo ranks, each owning half of the experts (linear and
  round-robin placements), both holding the same batch as inside vLLM; their
  outputs are summed as vLLM's tensor-parallel all-reduce does. The method
  object is sent to the ranks by pickling; one that cannot be pickled is
  skipped with the reason.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip
from ascend_kernel.settings import normalise_name

FAMILY = "moe_comm_method"
CONFIGS = ("qwen2_moe", "llama")
EXPERTS, TOP_K, HIDDEN, INTER = 8, 2, 16, 12
#: scenario -> (tokens, experts nobody routes to, most tokens on the first experts)
SCENARIOS: dict[str, tuple[int, tuple[int, ...], bool]] = {
    "random": (7, (), False),
    "unused-experts": (6, (2, 5), False),
    "skewed": (9, (), True),
    "one-token": (1, (), False),
    "empty": (0, (), False),
}
#: expert -> owning rank, for the two-rank check
PLACEMENTS = {"linear": (0, 0, 0, 0, 1, 1, 1, 1), "round-robin": (0, 1, 0, 1, 0, 1, 0, 1)}
TOLERANCE = 1e-5
#: a rank left waiting in a collective by the other rank's error gives up after this long
RANK_TIMEOUT_S = 60


def expert_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [E, 2I, H]: gate rows then up rows, w2 [E, H, I]), vLLM's layouts."""
    gen = torch.Generator().manual_seed(11)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN ** 0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER ** 0.5
    return w13, w2


def routed_batch(scenario: str, capacity: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, unused, skewed = SCENARIOS[scenario]
    if capacity is not None:
        tokens = min(tokens, capacity)
    gen = torch.Generator().manual_seed(sorted(SCENARIOS).index(scenario))
    x = torch.randn(tokens, HIDDEN, generator=gen)
    allowed = torch.tensor([e for e in range(EXPERTS) if e not in unused])
    ids = torch.empty(tokens, TOP_K, dtype=torch.int64)
    for t in range(tokens):
        ids[t] = allowed[:TOP_K] if skewed and t % 3 else allowed[torch.randperm(len(allowed), generator=gen)[:TOP_K]]
    weights = torch.rand(tokens, TOP_K, generator=gen) + 0.1
    return x, weights, ids


def dense_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    w13, w2 = (w.double() for w in expert_weights())
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            gate, up = (w13[int(ids[t, j])] @ x[t].double()).split(INTER)
            out[t] += float(weights[t, j]) * (w2[int(ids[t, j])] @ (torch.nn.functional.silu(gate) * up))
    return out


def local_experts(owners: tuple[int, ...] | None, rank: int) -> Any:
    """This rank's experts (all of them without ``owners``) over the reference ops, and the slot map."""
    from ascend_kernel.ops.moe_experts import LocalExperts

    from ascend_kernel.ops.reference import ReferenceOps

    owners = owners or (0,) * EXPERTS
    ranks = max(owners) + 1
    mine = [e for e in range(EXPERTS) if owners[e] == rank]
    local = len(mine)
    slot_of = torch.empty(EXPERTS, dtype=torch.int64)
    for r in range(ranks):
        for i, e in enumerate(e for e in range(EXPERTS) if owners[e] == r):
            slot_of[e] = r * local + i
    w13, w2 = expert_weights()
    return LocalExperts(w13[mine].transpose(1, 2).contiguous(), w2[mine].transpose(1, 2).contiguous(), slot_of,
                        local, ReferenceOps())


def run_method(method: Any, experts: Any, parallel: Any, x: torch.Tensor, weights: torch.Tensor,
               ids: torch.Tensor) -> torch.Tensor:
    dispatched = method.dispatch(x, weights, ids, experts, parallel)
    return method.combine(experts.mlp(dispatched.rows, dispatched.counts), dispatched)


def _compare(out: Any, want: torch.Tensor, where: str) -> None:
    assert isinstance(out, torch.Tensor), f"{where}: combine returned {type(out).__name__}"
    assert tuple(out.shape) == tuple(want.shape), f"{where}: combine returned shape {tuple(out.shape)}, " \
        f"expected {tuple(want.shape)}"
    err = (out.double() - want).abs().max().item() if want.numel() else 0.0
    assert err <= TOLERANCE * (1 + want.abs().max().item() if want.numel() else 1), \
        f"{where}: differs from the dense MoE by up to {err:.3g}"


def check_entry(entry: Any, kit: Any, checks: Checks, distributed: bool = False) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    _, method = built[0]

    def attributes() -> str:
        name = getattr(method, "name", None)
        assert isinstance(name, str) and normalise_name(name) in (entry.name, *entry.aliases), \
            f"name is {name!r}, the entry is '{entry.name}'"
        capacity = getattr(method, "capacity", "missing")
        assert capacity is None or (isinstance(capacity, int) and not isinstance(capacity, bool) and capacity >= 1), \
            f"capacity is {capacity!r}, not None or a whole number >= 1"
        fallback = getattr(method, "fallback", "missing")
        if capacity is None:
            assert fallback is None, f"fallback is {fallback!r} but there is no capacity to fall back from"
            return "no capacity"
        installed = {n for e in kit.entries.get(FAMILY, []) for n in (e.name, *e.aliases)}
        assert isinstance(fallback, str) and normalise_name(fallback) in installed, \
            f"capacity {capacity} with fallback {fallback!r}, which is not an installed method ({sorted(installed)})"
        return f"capacity {capacity}, fallback '{fallback}'"

    def single_rank() -> str:
        from ascend_kernel.ops.moe_parallel import MoEParallel

        experts = local_experts(None, 0)
        capacity = getattr(method, "capacity", None)
        for scenario in SCENARIOS:
            x, weights, ids = routed_batch(scenario, capacity)
            out = run_method(method, experts, MoEParallel.single(), x, weights, ids)
            _compare(out, dense_moe(x, weights, ids), f"scenario '{scenario}' ({x.shape[0]} tokens)")
        return f"{len(SCENARIOS)} scenarios on one rank"

    checks.run("attributes", attributes)
    checks.run("dense-equivalence", single_rank)
    if distributed:
        checks.run("dense-equivalence-2-ranks", lambda: two_ranks(method))


def check_entry_distributed(entry: Any, kit: Any, checks: Checks) -> None:
    check_entry(entry, kit, checks, distributed=True)


# -- two gloo ranks --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(method: Any) -> str:
    try:
        payload = pickle.dumps(method)
    except Exception as exc:
        raise Skip(f"the method object cannot be pickled to the ranks: {type(exc).__name__}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="ak-conformance-moe-") as out:
        (Path(out) / "method.pkl").write_bytes(payload)
        # the ranks are fresh interpreters (not multiprocessing children: no main-module re-import) that see
        # the same modules as this process, third-party plugins found through sys.path included
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, "-m", __name__, str(rank), port, out], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
        logs = []
        for proc in procs:
            try:
                logs.append(proc.communicate(timeout=RANK_TIMEOUT_S * 3)[0])
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise AssertionError(f"the two ranks did not finish within {RANK_TIMEOUT_S * 3} s") from None
        for rank, (proc, log) in enumerate(zip(procs, logs)):
            if proc.returncode != 0:
                tail = " | ".join(log.strip().splitlines()[-3:])
                raise AssertionError(f"rank {rank} exited with status {proc.returncode}: {tail}")
        results = [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for key, (error, _) in results[0].items():
        if error is None:
            error = results[1][key][0]
        if error is not None:
            raise AssertionError(f"{key}: the method raised {error}")
    capacity = getattr(method, "capacity", None)
    for (placement, scenario), (_, out) in results[0].items():
        total = out.double() + results[1][(placement, scenario)][1].double()  # vLLM's TP all-reduce
        _compare(total, dense_moe(*routed_batch(scenario, capacity)),
                 f"placement '{placement}', scenario '{scenario}'")
    return f"{len(PLACEMENTS)} placements x {len(SCENARIOS)} scenarios on two gloo ranks"


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from ascend_kernel.ops.moe_parallel import MoEParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=RANK_TIMEOUT_S))
    try:
        method = pickle.loads((Path(out_dir) / "method.pkl").read_bytes())
        world = dist.group.WORLD
        capacity = getattr(method, "capacity", None)
        results: dict[tuple[str, str], tuple[str | None, torch.Tensor | None]] = {}
        for placement, owners in PLACEMENTS.items():
            experts = local_experts(owners, rank)
            parallel = MoEParallel(world, rank, 2, rank, 2)  # both ranks hold the batch, each one shard
            for scenario in SCENARIOS:
                x, weights, ids = routed_batch(scenario, capacity)
                try:
                    results[(placement, scenario)] = (None, run_method(method, experts, parallel, x, weights, ids))
                except Exception as exc:  # noqa: BLE001 - reported by the parent, naming the scenario
                    results[(placement, scenario)] = (f"{type(exc).__name__}: {exc}", None)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # one rank of the two-rank check: python -m ... RANK PORT DIR
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

"""vLLM's ``EplbState``, as the kernel's runner drives it: synchronous, host-timed, reported, recordable.

The subclass adds no balancing of its own. vLLM's ``step`` keeps the load
window and decides when to rearrange, vLLM's ``rearrange`` all-reduces the
load, asks the policy (the chosen ``eplb_policy`` object) for the new
placement, moves the weights in place over the EPLB group's communicator
(``rearrange_expert_weights_inplace``) and commits the maps the MoE layers
read. What differs:

* on a CPU device, ``rearrange`` (and only it) runs with host stand-ins for what vLLM asks
  of an accelerator: ``torch.Event(enable_timing=True).record()`` raises
  there ("cpu backend doesn't support events") and the gloo communicator's
  ``torch.accelerator.current_stream().synchronize()`` finds no accelerator;
  for the call (a scoped swap, restored after) ``torch.Event`` is a host
  event timed by the host clock and the current stream one that is always done;
* each rearrangement is measured for the report (:meth:`describe`): the
  per-rank load imbalance (max / mean, over the window it rebalanced on),
  the slots that received new weights, the milliseconds it took;
* record and replay (the seed's ``expert_map_record_path``): the map is
  written as JSON at start and after every rearrangement; a replayed map is
  moved into place at start (vLLM's weight mover, then ``update_mapping``)
  and kept: no rearrangement follows;
* an interrupted move stops the rank's MoE layers. vLLM moves the weights
  layer by layer and commits the new map only after the last layer, so a
  peer that dies mid-transfer leaves this rank with some layers' weights
  already moved under the old map: serving on would route tokens to the
  wrong experts. The failure therefore detaches every MoE layer from the
  maps (each then refuses to run, naming the cause) and raises, so the
  rank never answers with a half-updated placement (:func:`stop_on_interruption`).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.eplb.eplb_state import EplbState

from ascend_kernel.errors import KernelError
from ascend_kernel.scoped import attributes_swapped


class HostEvent:
    """What vLLM's rearrangement asks of ``torch.Event``, on the host clock (milliseconds, like device events)."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.at = 0.0

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        """Host work is done when it returns: nothing to wait for."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.at - self.at) * 1e3


class HostStream:
    """The current "stream" of a CPU device: host work is complete when issued."""

    def synchronize(self) -> None:
        """Nothing is in flight on the host."""


def host_stream(device: Any = None) -> HostStream:
    """``torch.accelerator.current_stream`` on a CPU device (vLLM's gloo communicator syncs it before sending)."""
    return HostStream()


#: what this module found (on a CPU host vLLM-CPU's worker has already put its own placeholders there when it
#: imported ``vllm/v1/worker/cpu/shm.py``): what the stand-ins must give back after every move
TORCH_GLOBALS = {"torch.Event": (torch, "Event"), "torch.accelerator.current_stream": (torch.accelerator, "current_stream")}
_ORIGINALS = {name: getattr(owner, attr) for name, (owner, attr) in TORCH_GLOBALS.items()}


def swapped_globals() -> list[str]:
    """The torch globals the stand-ins replace that are not torch's own now (empty after every move)."""
    return [name for name, (owner, attr) in TORCH_GLOBALS.items() if getattr(owner, attr) is not _ORIGINALS[name]]


def cpu_standins() -> Any:
    """``torch.Event`` and ``torch.accelerator.current_stream`` as host stand-ins, for one block (restored after)."""
    return attributes_swapped((torch, "Event", HostEvent), (torch.accelerator, "current_stream", host_stream))


def rank_imbalance(load: torch.Tensor, ranks: int) -> float | None:
    """max / mean of the per-rank load ``load`` [layers, physical] (None when nothing was recorded)."""
    per_rank = load.double().reshape(load.shape[0], ranks, -1).sum(dim=(0, 2))
    mean = float(per_rank.mean())
    return None if mean == 0 else float(per_rank.max()) / mean


def projected_load(load: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The physical load ``load`` (recorded under map ``old``) as it falls under map ``new``.

    Each logical expert's load is split evenly over its replicas (what the
    layer's hash of token indices does on average).
    """
    logical = torch.zeros(load.shape[0], int(max(old.max(), new.max())) + 1, dtype=torch.float64)
    logical.scatter_add_(1, old.long(), load.double())
    replicas = torch.zeros_like(logical).scatter_add_(1, new.long(), torch.ones_like(new, dtype=torch.float64))
    return torch.gather(logical / replicas.clamp_min(1), 1, new.long())


class StoppedExperts:
    """The EPLB state of a MoE layer whose rearrangement was interrupted: every read refuses, naming why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __getattr__(self, name: str) -> Any:
        raise KernelError(self.reason)


@contextlib.contextmanager
def stop_on_interruption(methods: list[Any], rank: int) -> Any:
    """Run a weight move; if it fails, detach ``methods`` (the MoE layers' methods) from EPLB and raise."""
    try:
        yield
    except Exception as exc:
        reason = (f"EPLB rearrangement interrupted on expert-parallel rank {rank} ({type(exc).__name__}: {exc}): "
                  "expert weights may be half-moved and the new map was never committed, so this rank's MoE "
                  "layers stop serving; restart the engine (eplb_record_path keeps the last committed map)")
        for method in methods:
            method.attach_eplb(StoppedExperts(reason))
        raise KernelError(reason) from exc


class KernelEplbState(EplbState):
    """vLLM's EPLB state with the kernel's policy object, host timing on CPU, a report, record and replay."""

    def __init__(self, parallel_config: Any, device: torch.device, policy: Any, ep_size: int,
                 record_path: str = "", replay_path: str = "") -> None:
        super().__init__(parallel_config, device)
        self.kernel_policy = policy
        self.ep_size = ep_size
        self.record_path = record_path
        self.replay_path = replay_path
        self.history: list[dict[str, Any]] = []
        #: the MoE methods reading this state's maps (:meth:`attach`)
        self.methods: list[Any] = []
        describe = getattr(policy, "describe", None)
        #: the ``eplb`` object of the report (a live dict: the runner's trace shows it as it is)
        self.report: dict[str, Any] = {
            "policy": getattr(policy, "name", type(policy).__name__), "policy_config": describe() if describe else {},
            "rebalances": 0, "moved_experts": 0, "imbalance_before": None, "imbalance_after": None,
            "imbalance_after_projected": None, "rebalance_ms": 0.0, "rebalance_ms_per_layer": None,
            "replayed": bool(replay_path), "history": self.history}

    def add_model(self, model: Any, model_config: Any, model_name: str | None = None) -> None:
        super().add_model(model, model_config, model_name)
        self.policy = self.kernel_policy  # vLLM's add_model set its own from the (default-only) config field
        self.report["num_moe_layers"] = model.num_moe_layers
        self.report["physical_experts"] = model.num_physical_experts
        self.report["logical_experts"] = model.num_logical_experts
        if self.replay_path:
            self._replay(model, model_config)
        self._record()

    def attach(self, model: Any, methods: list[Any]) -> None:
        """Have each MoE layer's kernel method read its live maps and record its load."""
        for layer, method in zip(model.moe_layers, methods):
            method.attach_eplb(layer.eplb_state)
        self.methods = list(methods)

    def _moving(self) -> Any:
        """The scope of a weight move: host stand-ins on CPU, the layers stopped if it is interrupted."""
        from vllm.distributed.parallel_state import get_ep_group

        stack = contextlib.ExitStack()
        stack.enter_context(stop_on_interruption(self.methods, get_ep_group().rank_in_group))
        stack.enter_context(self._events())
        return stack

    def _model_state(self) -> Any:
        return next(iter(self.model_states.values()))

    def _events(self) -> Any:
        return cpu_standins() if self.device.type == "cpu" else contextlib.nullcontext()

    def rearrange(self, is_profile: bool = False, rank_mapping: dict[int, int] | None = None,
                  use_last_expert_load: bool = False) -> torch.Tensor | None:
        if is_profile or rank_mapping is not None or use_last_expert_load:
            with self._events():
                return super().rearrange(is_profile, rank_mapping, use_last_expert_load)
        if self.replay_path:  # a replayed map is static: vLLM's step still reaches here every step_interval steps
            return None
        state = self._model_state()
        old = state.physical_to_logical_map.detach().cpu().clone()
        load = state.expert_load_window.sum(dim=0).cpu()  # [layers, physical] over the window, under ``old``
        started = time.perf_counter()
        with self._moving():
            out = super().rearrange(is_profile, rank_mapping, use_last_expert_load)
        took = (time.perf_counter() - started) * 1e3
        self.report["globals_left_swapped"] = swapped_globals()  # the report shows that the swap was undone
        new = state.physical_to_logical_map.detach().cpu().clone()
        self._account(old, new, load, took)
        self._record()
        return out

    def _account(self, old: torch.Tensor, new: torch.Tensor, load: torch.Tensor, took_ms: float) -> None:
        measured = rank_imbalance(load, self.ep_size)
        projected = rank_imbalance(projected_load(load, old, new), self.ep_size) if measured is not None else None
        moved = int((old != new).sum())
        report = self.report
        if report["rebalances"] == 0:
            report["imbalance_before"] = measured
            report["imbalance_after_projected"] = projected
        elif measured is not None:
            report["imbalance_after"] = measured  # a window recorded under a map a rearrangement installed
        report["rebalances"] += 1
        report["moved_experts"] += moved
        report["rebalance_ms"] += took_ms
        report["rebalance_ms_per_layer"] = report["rebalance_ms"] / report["rebalances"] / old.shape[0]
        self.history.append({"imbalance": measured, "projected": projected, "moved": moved, "ms": took_ms,
                             "map": new.tolist()})

    # -- record and replay ----------------------------------------------------------

    def _record(self) -> None:
        if not self.record_path or torch.distributed.get_rank() != 0:
            return
        state = self._model_state()
        document = {"num_logical_experts": state.model.num_logical_experts,
                    "num_physical_experts": state.model.num_physical_experts, "ep_size": self.ep_size,
                    "physical_to_logical": state.physical_to_logical_map.cpu().tolist()}
        path = Path(self.record_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(document))
        tmp.replace(path)  # readers never see half a map

    def _replay(self, model: Any, model_config: Any) -> None:
        from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace
        from vllm.distributed.parallel_state import get_ep_group

        new = load_recorded_map(self.replay_path, model)
        state = self._model_state()
        old = state.physical_to_logical_map.clone()
        with self._moving():
            rearrange_expert_weights_inplace(old, new.to(old.device), model.expert_weights, state.expert_buffer,
                                             get_ep_group().device_group, state.communicator)
        self.update_mapping(model_config, new.to(old.device))
        self.report["moved_experts"] += int((old.cpu() != new).sum())


def load_recorded_map(path: str, model: Any) -> torch.Tensor:
    """A recorded physical -> logical map, checked against this model (one clear error otherwise)."""
    try:
        document = json.loads(Path(path).read_text())
        new = torch.tensor(document["physical_to_logical"], dtype=torch.int64)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KernelError(f"eplb_replay_path {path!r} is not a recorded expert map: {exc}") from None
    expected = (model.num_moe_layers, model.num_physical_experts)
    if tuple(new.shape) != expected:
        raise KernelError(f"eplb_replay_path {path!r} holds a map of shape {tuple(new.shape)}; this model needs "
                          f"{expected} (MoE layers, physical experts: check num_redundant_experts)")
    logical = model.num_logical_experts
    for layer, row in enumerate(new):
        if row.min() < 0 or row.max() >= logical or torch.unique(row).numel() != logical:
            raise KernelError(f"eplb_replay_path {path!r}: layer {layer} must place every one of the {logical} "
                              f"logical experts (ids 0..{logical - 1}) at least once")
    return new

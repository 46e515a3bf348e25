"""EPLB replay keeps its map whatever ``step_interval`` is (issue 41, bug 6), while recording still rearranges.

vLLM's own ``EplbState.step`` runs (the counter, the interval, the call to
``rearrange``); what would move weights (vLLM's ``rearrange`` and the scope a
move runs in) is replaced by a recorder, since the question is only whether
a move is started.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from vllm.distributed.eplb import eplb_state
from vllm.distributed.eplb.eplb_state import EplbState

from ascend_kernel_plugins.eplb.state import KernelEplbState


@pytest.fixture
def moves(monkeypatch):
    started: list[bool] = []
    monkeypatch.setattr(EplbState, "rearrange", lambda self, *a, **k: started.append(True))
    monkeypatch.setattr(KernelEplbState, "_moving", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(eplb_state, "get_ep_group", lambda: SimpleNamespace(device_group=None))  # one EP rank
    return started


def _state(replay: str, interval: int) -> KernelEplbState:
    from vllm.config import EPLBConfig

    config = SimpleNamespace(eplb_config=EPLBConfig(step_interval=interval, window_size=1))
    state = KernelEplbState(config, torch.device("cpu"), policy=SimpleNamespace(name="default"), ep_size=2,
                            replay_path=replay)
    state.expert_rearrangement_step_interval, state.expert_load_window_size = interval, 1
    placement = torch.tensor([[0, 1, 2, 3]])
    state.model_states = {"m": SimpleNamespace(physical_to_logical_map=placement,
                                               expert_load_window=torch.ones(1, 1, 4),
                                               expert_load_pass=torch.ones(1, 4))}
    return state


@pytest.mark.parametrize("interval", [1, 2, 5])
def test_a_replayed_map_is_never_rearranged(moves, interval, tmp_path):
    state = _state(str(tmp_path / "map.json"), interval)
    for _ in range(12):
        state.step()
    assert moves == [] and state.report["rebalances"] == 0


def test_without_replay_the_interval_rearranges(moves):
    state = _state("", 2)
    for _ in range(6):
        state.step()
    assert len(moves) == 3 and state.report["rebalances"] == 3

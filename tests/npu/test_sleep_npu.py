"""Sleep mode's NPU provider and the controller's refusals, with the stand-in NPU's ``torch.npu`` module.

The stand-in's tensors have no storage of their own (they wrap host
tensors), so the storage-level freeing itself runs on host tensors here (the
reference provider's semantics, tested in tests/test_sleep_pools.py); what
is NPU-only is checked on the stand-in: which provider an NPU worker gets,
that its release reaches the device's own allocator and measures what it
gave back, and that every path that frees refuses first what it cannot keep.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from ascend_kernel_plugins.sleep_mode.controller import SleepController
from ascend_kernel_plugins.sleep_mode.plugin import ascend_kernel_sleep_mode, pools_for


def _worker(device: str = "npu", graph: str = "eager", connector: bool = False):
    model = torch.nn.Linear(4, 4)
    kv = [torch.ones(2, 64)]
    runner = SimpleNamespace(get_model=lambda: model, kv_caches=kv, device=torch.device(device),
                             kernel=SimpleNamespace(records=[SimpleNamespace(family="graph", chosen=graph)]))
    config = SimpleNamespace(model_config=SimpleNamespace(sleep_preserve_parameter_names=[]),
                             kv_transfer_config=SimpleNamespace(kv_connector="MooncakeConnectorV1") if connector
                             else None)
    return SimpleNamespace(model_runner=runner, vllm_config=config), kv


def test_an_npu_worker_gets_the_npu_provider(standin_module):
    from ascend_kernel_plugins.sleep_mode.npu_pools import NpuTaggedPools

    pools = pools_for("npu")
    assert type(pools) is NpuTaggedPools and pools._device.kind == "npu"
    worker, _ = _worker()
    assert type(ascend_kernel_sleep_mode(worker).pools) is NpuTaggedPools


def test_the_npu_release_reaches_the_devices_allocator_and_measures_it(standin_module, caplog):
    """Bug 5 of issue 41: torch.accelerator.empty_cache does not reach torch_npu's allocator; the log said freed."""
    worker, kv = _worker()
    controller = SleepController(worker, pools_for("npu"))
    standin_module.reserved = 3 * 2**20
    with caplog.at_level(logging.INFO, logger="ascend_kernel"):
        controller.sleep(2)
    assert "empty_cache" in standin_module.calls and standin_module.reserved == 0
    assert controller.pools.reserved == (3 * 2**20, 0)
    assert "reserved memory went 3.0 -> 0.0 MiB" in caplog.text
    assert kv[0].untyped_storage().nbytes() == 0


def test_a_release_that_frees_nothing_is_said(standin_module, caplog, monkeypatch):
    worker, _ = _worker()
    controller = SleepController(worker, pools_for("npu"))
    standin_module.reserved = 2**20
    monkeypatch.setattr(standin_module, "empty_cache", lambda: standin_module.calls.append("empty_cache"))
    with caplog.at_level(logging.INFO, logger="ascend_kernel"):
        controller.sleep(2)
    assert "did not go back to the device" in caplog.text


@pytest.mark.parametrize("graph,connector,match", [("aclgraph", False, "cannot keep graph mode 'aclgraph'"),
                                                   ("eager", True, "engine with a KV connector")])
def test_discard_is_refused_as_sleep_is(standin_module, graph, connector, match):
    """Bug 4: vLLM's release_kv_cache_memory reaches discard(), which freed the KV cache without the check."""
    worker, kv = _worker(graph=graph, connector=connector)
    controller = SleepController(worker, pools_for("npu"))
    with pytest.raises(RuntimeError, match=match):
        controller.discard(("kv_cache",))
    assert kv[0].untyped_storage().nbytes() == 2 * 64 * 4  # nothing was freed

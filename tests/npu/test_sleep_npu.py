"""Sleep mode's NPU provider and the controller's refusals, with the stand-in NPU's ``torch.npu`` module.

What is NPU-only is checked on the stand-in: which provider an NPU worker
gets, that its release reaches the device's own allocator and measures what
it gave back, that every path that frees refuses first what it cannot keep,
and the freeing itself on device tensors: a stand-in device tensor's storage
is the host memory behind it (shared by its views, as a device storage is),
so the pools free it, offload its contents and restore them through the NPU
provider, on tensors that are on ``npu:0``.
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


def test_the_npu_provider_frees_and_restores_device_tensors(standin_module, monkeypatch):
    """Tied weights and a KV buffer viewed per layer, all on npu:0: level 2 frees every storage (the tied twin
    and the views once), the release reaches the device allocator, and waking restores the weights a checkpoint
    reload would refill as zeros, the preserved buffer as it was, the KV cache zero-filled; views still alias.

    What is kept (the preserved buffer here, offloaded weights) goes to pinned host memory on an NPU; the
    stand-in cannot pin (torch asks the device's hooks for a pinned allocator, which only C++ can register), so
    these tests give the provider a plain host buffer instead."""
    from ascend_kernel_plugins.sleep_mode.npu_pools import NpuTaggedPools

    from npu.standin import DEVICE, host, npu

    monkeypatch.setattr(NpuTaggedPools, "_host_buffer", lambda self, n: torch.empty(n, dtype=torch.uint8))

    model = torch.nn.Module()
    model.embed = torch.nn.Parameter(npu(torch.arange(12.0).reshape(3, 4) + 1), requires_grad=False)
    model.register_buffer("rope", npu(torch.linspace(1, 2, 8)))
    kv = npu(torch.ones(2, 3, 4))
    worker, _ = _worker()
    worker.model_runner.get_model = lambda: model
    worker.model_runner.kv_caches = [kv[0], kv[1]]
    controller = SleepController(worker, pools_for("npu"))
    assert type(controller.pools) is NpuTaggedPools and model.embed.device == DEVICE
    standin_module.reserved = 2**20
    controller.sleep(2)
    assert model.embed.untyped_storage().nbytes() == 0 and kv.untyped_storage().nbytes() == 0
    assert controller.pools.describe()["kv_cache"] == {"state": "discarded", "bytes": 2 * 3 * 4 * 4, "storages": 1}
    assert "empty_cache" in standin_module.calls and controller.pools.reserved == (2**20, 0)
    controller.wake_up(None)
    assert host(model.embed).tolist() == [[0.0] * 4] * 3  # dropped: the reload refills it
    assert host(model.rope).tolist() == torch.linspace(1, 2, 8).tolist()  # buffers are kept
    assert host(kv).eq(0).all() and kv.device == DEVICE
    kv[1].fill_(7)  # the per-layer views still alias the one backing buffer
    assert host(worker.model_runner.kv_caches[1]).eq(7).all()


def test_offload_copies_device_contents_out_and_back(standin_module, monkeypatch):
    from ascend_kernel_plugins.sleep_mode.npu_pools import NpuTaggedPools

    from npu.standin import host, npu

    monkeypatch.setattr(NpuTaggedPools, "_host_buffer", lambda self, n: torch.empty(n, dtype=torch.uint8))
    weights = npu(torch.randn(4, 6, generator=torch.Generator().manual_seed(3)))
    tied = weights.view(6, 4)
    before = host(weights)
    pools = pools_for("npu")
    pools.register("weights", [("w", weights), ("tied", tied)])
    assert pools.describe()["weights"]["storages"] == 1  # the tied twin shares the device storage
    assert pools.offload("weights") == 4 * 6 * 4 and weights.untyped_storage().nbytes() == 0
    assert pools.restore("weights") == 4 * 6 * 4
    assert torch.equal(host(weights), before) and torch.equal(host(tied), before.view(6, 4))

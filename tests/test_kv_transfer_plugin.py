"""The kv-transfer plugin without engines: its config fix-up, the connector vLLM then builds, the counters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ascend_kernel_plugins.kv_transfer.counts import TransferCounts
from ascend_kernel_plugins.kv_transfer.plugin import KVTransferUnsupported, ascend_kernel_configure


def config(connector: str = "MooncakeConnector", inner_state: bool = False) -> SimpleNamespace:
    from vllm.config import KVTransferConfig

    kv = KVTransferConfig(kv_connector=connector, kv_role="kv_producer",
                          kv_connector_extra_config={"mooncake_protocol": "tcp"})
    model = SimpleNamespace(has_inner_state=inner_state, architecture="Mamba2ForCausalLM" if inner_state else "X")
    return SimpleNamespace(kv_transfer_config=kv, model_config=model)


def test_mooncake_is_routed_to_the_kernels_subclass_with_recorded_changes():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import MooncakeConnector

    from ascend_kernel_plugins.kv_transfer.mooncake import KernelMooncakeConnector

    cfg = config()
    changes = ascend_kernel_configure(settings=None, vllm_config=cfg, device=None)
    assert [(c.path, c.old, c.new) for c in changes] == [
        ("kv_transfer_config.kv_connector_module_path", None, "ascend_kernel_plugins.kv_transfer.mooncake"),
        ("kv_transfer_config.kv_connector", "MooncakeConnector", "KernelMooncakeConnector")]
    assert all("device index" in c.reason for c in changes)
    connector = KVConnectorFactory.get_connector_class(cfg.kv_transfer_config)
    assert connector is KernelMooncakeConnector and issubclass(connector, MooncakeConnector)
    # a second configure (another process building the same config) changes nothing
    assert ascend_kernel_configure(settings=None, vllm_config=cfg, device=None) is None


def test_other_connectors_pass_untouched():
    cfg = config("ExampleConnector")
    assert ascend_kernel_configure(settings=None, vllm_config=cfg, device=None) is None
    assert cfg.kv_transfer_config.kv_connector == "ExampleConnector"
    assert ascend_kernel_configure(settings=None, vllm_config=SimpleNamespace(kv_transfer_config=None),
                                   device=None) is None


def test_recurrent_state_is_refused_naming_model_and_connector():
    with pytest.raises(KVTransferUnsupported, match=r"MooncakeConnector.*Mamba2ForCausalLM.*recurrent"):
        ascend_kernel_configure(settings=None, vllm_config=config(inner_state=True), device=None)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the patch only acts on hosts without an accelerator")
def test_device_index_and_worker_class_change_only_inside():
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector

    from ascend_kernel_plugins.kv_transfer.mooncake import KernelMooncakeWorker, building_kernel_worker

    vllm_worker = mooncake_connector.MooncakeConnectorWorker
    with building_kernel_worker():
        assert torch.accelerator.current_device_index() == 0
        assert mooncake_connector.MooncakeConnectorWorker is KernelMooncakeWorker
    with pytest.raises(RuntimeError):
        torch.accelerator.current_device_index()
    assert mooncake_connector.MooncakeConnectorWorker is vllm_worker
    with pytest.raises(ZeroDivisionError), building_kernel_worker():
        1 / 0
    assert mooncake_connector.MooncakeConnectorWorker is vllm_worker, "restored on an error too"


def test_counts_derive_blocks_and_bytes():
    counts = TransferCounts(bytes_per_block=1024)
    counts.sent(3072)
    counts.sent(1024)
    counts.received(2)
    counts.failure()
    report = counts.as_dict()
    assert (report["kv_blocks_sent"], report["kv_bytes_sent"]) == (4, 4096)
    assert (report["kv_blocks_received"], report["kv_bytes_received"], report["kv_requests_received"]) == (2, 2048, 1)
    assert report["kv_bytes_transferred"] == 4096 + 2048 and report["kv_failed_transfers"] == 1


def test_a_transfer_engine_that_does_not_load_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "mooncake.engine", None)  # import fails as when not installed
    with pytest.raises(KVTransferUnsupported, match=r"transfer engine does not load.*ascend-kernel\[pd\].*libibverbs1"):
        ascend_kernel_configure(settings=None, vllm_config=config(), device=None)


def test_a_protocol_mooncake_does_not_have_is_refused_by_the_fixup():
    """Mooncake's engine takes any protocol name and falls back to TCP; the kernel refuses the typo at start-up."""
    cfg = config()
    cfg.kv_transfer_config.kv_connector_extra_config["mooncake_protocol"] = "rmda"
    with pytest.raises(KVTransferUnsupported,
                       match=r"mooncake_protocol='rmda' is not a Mooncake transport.*'tcp', 'rdma'"):
        ascend_kernel_configure(settings=None, vllm_config=cfg, device=None)
    assert cfg.kv_transfer_config.kv_connector == "MooncakeConnector"  # nothing rewritten


@pytest.mark.parametrize(("timeout", "abort", "allowed"), [(15.0, 10, True), (10.0, 10, False), (60.0, 480, False),
                                                          (None, 480, True)])
def test_pull_timeout_must_outlast_the_producers_abort_timeout(monkeypatch, timeout, abort, allowed):
    from ascend_kernel.errors import SettingsError
    from ascend_kernel.settings import load_settings

    monkeypatch.setenv("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", str(abort))
    settings = load_settings({"ascend_kernel": {"kv_transfer_pull_timeout_s": timeout}} if timeout else None)
    if allowed:
        assert ascend_kernel_configure(settings=settings, vllm_config=config(), device=None)
    else:
        with pytest.raises(SettingsError, match=rf"KV_TRANSFER_PULL_TIMEOUT_S={timeout:g} is not allowed with "
                                                rf"VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT={abort}.*allowed: a number "
                                                rf"of seconds > {abort}, or unset"):
            ascend_kernel_configure(settings=settings, vllm_config=config(), device=None)


def test_on_an_npu_an_unset_protocol_becomes_ascends_own_transport():
    npu = SimpleNamespace(kind="npu")
    cfg = config()
    del cfg.kv_transfer_config.kv_connector_extra_config["mooncake_protocol"]
    changes = ascend_kernel_configure(settings=None, vllm_config=cfg, device=npu)
    assert cfg.kv_transfer_config.kv_connector_extra_config == {"mooncake_protocol": "ascend"}
    assert changes[0].path == "kv_transfer_config.kv_connector_extra_config" and "Ascend NPUs" in changes[0].reason
    # a protocol the user chose stands (tcp between NPU hosts is allowed)
    chosen = config()
    ascend_kernel_configure(settings=None, vllm_config=chosen, device=npu)
    assert chosen.kv_transfer_config.kv_connector_extra_config == {"mooncake_protocol": "tcp"}


def test_ascends_transport_on_a_host_without_an_npu_is_refused():
    cfg = config()
    cfg.kv_transfer_config.kv_connector_extra_config["mooncake_protocol"] = "ascend"
    with pytest.raises(KVTransferUnsupported,
                       match=r"'ascend' is Mooncake's transport between Ascend NPUs.*'tcp', 'rdma'"):
        ascend_kernel_configure(settings=None, vllm_config=cfg, device=SimpleNamespace(kind="cpu"))
    assert cfg.kv_transfer_config.kv_connector == "MooncakeConnector"  # nothing rewritten


def test_a_missing_engine_on_an_npu_names_the_npu_build(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "mooncake.engine", None)
    with pytest.raises(KVTransferUnsupported, match=r"pd-npu.*mooncake-transfer-engine-npu"):
        ascend_kernel_configure(settings=None, vllm_config=config(), device=SimpleNamespace(kind="npu"))

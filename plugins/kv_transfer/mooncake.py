"""vLLM's ``MooncakeConnector`` as the kernel runs it: a device index on CPU hosts, and counted transfers.

The kernel's config fix-up (:mod:`ascend_kernel_plugins.kv_transfer.plugin`)
points ``kv_transfer_config`` at :class:`KernelMooncakeConnector`, a subclass
that changes nothing in how pages move:

* **A device index on a CPU host.** vLLM's connector worker asks
  ``torch.accelerator.current_device_index()`` before it starts the transfer
  engine, and torch's CPU build raises there (no accelerator). The worker is
  built with that one call answering 0 (the CPU platform's only device; its
  ``set_device`` is a no-op) and the call is restored right after
  (:func:`ascend_kernel.scoped.attributes_swapped`: one scoped swap at a time
  in the process). Where an accelerator exists nothing is patched.
* **The producer says where its pages are.** vLLM's producer finishes a
  request with no ``kv_transfer_params``, so a proxy would have to learn the
  producer's engine id and bootstrap address some other way. Here a request
  that asked for remote decode (``do_remote_decode`` with a ``transfer_id``)
  and whose pages are held for the consumer finishes with exactly the
  parameters a consumer needs (``do_remote_prefill``, ``remote_engine_id``,
  ``remote_bootstrap_addr``, ``transfer_id``), so ``ascend-kernel pd-proxy``
  forwards the prefill's answer, as with vLLM's NIXL connector.
* **Counted transfers.** vLLM's connector builds its worker as a
  :class:`KernelMooncakeWorker` (vLLM's worker with a few methods wrapped:
  its module's worker class is the subclass while this connector is built,
  and vLLM's again after) so each worker keeps running totals of pages sent and received
  (:class:`~ascend_kernel_plugins.kv_transfer.counts.TransferCounts`), which
  the worker's report RPC reads through :meth:`KernelMooncakeConnector.describe_transfer`.
* **A bounded pull** (``ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S``). vLLM's
  consumer waits for a producer worker's answer up to its socket timeout,
  ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` + 60 s, fixed; a producer that died
  after its prefill answered costs every request sent to it that long. With
  the setting, a pull that got no answer in time fails its requests the way
  vLLM fails any pull (their blocks freed, the requests ended with an error).
  The setting must exceed the abort timeout (the config fix-up refuses
  less): until then a live producer may still write into those blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnector,
    MooncakeConnectorWorker,
)

from ascend_kernel.scoped import attributes_swapped
from ascend_kernel.upstream import connector_vllm_config, mooncake_blocks_per_logical_block
from ascend_kernel_plugins.kv_transfer.counts import TransferCounts

#: what ``kv_transfer_config`` names after the fix-up
CONNECTOR_CLASS = "KernelMooncakeConnector"
CONNECTOR_MODULE = __name__


def _device_index_zero() -> int:
    return 0


@contextlib.contextmanager
def building_kernel_worker() -> Iterator[None]:
    """Inside: vLLM's connector builds a :class:`KernelMooncakeWorker`, and, when torch sees no accelerator,
    ``torch.accelerator.current_device_index()`` answers 0. Both are vLLM's / torch's again after."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector

    swaps: list[tuple[Any, str, Any]] = [(mooncake_connector, "MooncakeConnectorWorker", KernelMooncakeWorker)]
    if not torch.accelerator.is_available():
        swaps.append((torch.accelerator, "current_device_index", _device_index_zero))
    with attributes_swapped(*swaps):
        yield


class KernelMooncakeWorker(MooncakeConnectorWorker):
    """vLLM's Mooncake worker with running totals and a bounded pull (built by vLLM's connector, see
    :func:`building_kernel_worker`).

    * producer: every successful ``batch_transfer_sync_write`` adds its bytes;
    * consumer: a request whose pull completes adds its local blocks (the
      blocks it asked for: prompt blocks it had no cached copy of);
    * both: every failed write, and every request whose pull failed (not the
      empty pulls that only ask a producer to free a request's pages), is counted;
    * consumer: with ``kernel_pull_timeout_s`` set, a pull that waits longer fails.
    """

    kernel_counts: TransferCounts
    #: seconds one pull may wait for a producer worker (None: vLLM's own socket timeout)
    kernel_pull_timeout_s: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kernel_counts = TransferCounts()
        super().__init__(*args, **kwargs)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        # one logical block = its kernel blocks in every registered region
        self.kernel_counts.bytes_per_block = (sum(self.kv_block_len_per_layer)
                                              * mooncake_blocks_per_logical_block(self))

    def _send_blocks(self, remote_session: str, src_ptrs: list[int], dst_ptrs: list[int],
                     lengths: list[int]) -> int:
        status = super()._send_blocks(remote_session, src_ptrs, dst_ptrs, lengths)
        if status == 0:
            self.kernel_counts.sent(sum(lengths))
        else:
            self.kernel_counts.failure()
        return status

    def process_pulling_result(self, response: Any, pull_metas: dict[str, Any]) -> None:
        for req_id in response.ok_reqs or ():
            meta = pull_metas.get(req_id)
            # the pull that brings the count to 0 completes the request (one per producer worker)
            if meta is not None and not meta.failed and meta.pull_tasks_count == 1 and any(meta.local_block_ids):
                self.kernel_counts.received(sum(len(group) for group in meta.local_block_ids))
        super().process_pulling_result(response, pull_metas)

    async def receive_kv_from_single_worker(self, worker_addr: str, pull_metas: dict[str, Any]) -> None:
        timeout = self.kernel_pull_timeout_s
        if timeout is None:
            await super().receive_kv_from_single_worker(worker_addr, pull_metas)
            return
        try:
            # cancelling the pull closes its socket (vLLM's code catches Exception, not the cancellation)
            await asyncio.wait_for(super().receive_kv_from_single_worker(worker_addr, pull_metas), timeout)
        except asyncio.TimeoutError:
            self._handle_failed_recv(pull_metas, list(pull_metas),
                                     f"producer worker {worker_addr} sent no answer within {timeout:g} s "
                                     "(ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S)")

    def _handle_failed_recv(self, pull_metas: dict[str, Any], req_ids: Any, reason: str) -> None:
        for req_id in req_ids:
            meta = pull_metas.get(req_id)
            # a pull without local blocks only asks the producer to free its pages (a request that never ran here)
            if meta is not None and not meta.failed and any(meta.local_block_ids):
                self.kernel_counts.failure()
        super()._handle_failed_recv(pull_metas, req_ids, reason)


class KernelMooncakeConnector(MooncakeConnector):
    """vLLM's ``MooncakeConnector``, built so it runs on the kernel's CPU platform and counts what it moves."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        with building_kernel_worker():
            super().__init__(vllm_config, role, kv_cache_config)
        worker = self.connector_worker
        if worker is not None:
            from ascend_kernel.settings import load_settings

            worker.kernel_pull_timeout_s = load_settings(
                getattr(vllm_config, "additional_config", None)).kv_transfer_pull_timeout_s

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        held, params = super().request_finished(request, block_ids)
        return held, params if params is not None else self._consumer_params(request, held)

    def request_finished_all_groups(self, request: Any,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        held, params = super().request_finished_all_groups(request, block_ids)
        return held, params if params is not None else self._consumer_params(request, held)

    def _consumer_params(self, request: Any, held: bool) -> dict[str, Any] | None:
        """What the decode instance's request must carry to pull this prefill's pages (None: nothing held)."""
        asked = request.kv_transfer_params or {}
        if not held or not asked.get("do_remote_decode") or not asked.get("transfer_id"):
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": asked["transfer_id"],
                "remote_engine_id": self.engine_id, "remote_bootstrap_addr": self._bootstrap_url()}

    def _bootstrap_url(self) -> str:
        """The producer's bootstrap server as a consumer reaches it.

        An explicit ``kv_connector_extra_config.bootstrap_server_address`` wins;
        otherwise this host's address (``VLLM_HOST_IP`` or the outbound
        interface, as the workers register themselves) and the bootstrap port
        vLLM's connector listens on (``VLLM_MOONCAKE_BOOTSTRAP_PORT``).
        """
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
            get_mooncake_bootstrap_addr,
        )
        from vllm.utils.network_utils import get_ip, make_zmq_path

        transfer_config = connector_vllm_config(self).kv_transfer_config
        explicit = transfer_config.get_from_extra_config("bootstrap_server_address", None)
        if explicit is not None:
            return explicit if "://" in explicit else f"http://{explicit}"
        _, port = get_mooncake_bootstrap_addr(connector_vllm_config(self))
        return make_zmq_path("http", get_ip(), port)

    def describe_transfer(self) -> dict[str, Any]:
        """This worker's transfer totals (the report's ``kv_transfer``)."""
        worker = self.connector_worker
        counts = worker.kernel_counts.as_dict() if worker is not None else {}
        role = connector_vllm_config(self).kv_transfer_config.kv_role
        return {"connector": "MooncakeConnector", "kv_role": role, **counts}

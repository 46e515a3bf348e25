"""What a worker's ``sleep`` / ``wake_up`` / ``discard`` do: which tensors go under which tag, and when.

vLLM's levels, on the kernel's tagged pools (:mod:`.pools`):

* level 1: the KV cache is discarded; the weights are offloaded to host
  memory, except on a host device, where they already are (offloading would
  copy them beside themselves and free nothing): there they stay put.
* level 2: the KV cache and the weights are discarded. Buffers (rotary
  tables and the like, which no checkpoint holds) and the parameters named
  by ``sleep_preserve_parameter_names`` keep a host copy; the other weights
  come back as zeros on ``wake_up`` and are refilled by vLLM's
  ``reload_weights`` (``llm.collective_rpc("reload_weights")``).

The engine core has paused scheduling and reset the prefix cache before a
worker is asked to sleep (vLLM's ``EngineCore.sleep``), so no request ever
reads a block whose contents were dropped; restored KV memory is zero-filled.
The tensors are registered at the first sleep, when the model and the KV
cache exist, from the runner's model (and drafter) and ``kv_caches``.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any, Iterator

import torch

from ascend_kernel_plugins.sleep_mode.pools import TaggedPools

logger = logging.getLogger("ascend_kernel")

#: graph modes whose replays read no captured storage address (the only ones a sleep can keep valid)
ADDRESS_FREE_GRAPH_MODES = ("eager",)


def _flatten(caches: Any) -> Iterator[torch.Tensor]:
    """The tensors of the runner's ``kv_caches`` (a list, possibly of lists or tuples per layer)."""
    if isinstance(caches, torch.Tensor):
        yield caches
    elif isinstance(caches, (list, tuple)):
        for item in caches:
            yield from _flatten(item)


class SleepController:
    """One worker's sleep mode, over one provider of tagged pools."""

    def __init__(self, worker: Any, pools: TaggedPools) -> None:
        self.worker = worker
        self.pools = pools
        self.level: int | None = None

    @property
    def _weights_stay_on_host(self) -> bool:
        return self.worker.model_runner.device.type == "cpu"

    def _register(self) -> None:
        if self.pools.tags():
            return
        runner = self.worker.model_runner
        kv = list(_flatten(runner.kv_caches))
        if not kv:
            raise RuntimeError("sleep mode: this worker has no KV cache tensors to free (is the engine initialised?)")
        models = [runner.get_model()]
        drafter_model = getattr(getattr(runner, "drafter", None), "model", None)
        if isinstance(drafter_model, torch.nn.Module):
            models.append(drafter_model)
        keep = list(self.worker.vllm_config.model_config.sleep_preserve_parameter_names or [])
        try:
            for prefix, model in zip(("", "draft."), models):
                params = [(prefix + n, p) for n, p in model.named_parameters()]
                kept = [(n, p) for n, p in params if any(fnmatch.fnmatchcase(n, k) for k in keep)]
                self.pools.register("weights", kept, preserve=True)
                self.pools.register("weights", [(prefix + n, b) for n, b in model.named_buffers()], preserve=True)
                self.pools.register("weights", params)
            self.pools.register("kv_cache", [(f"kv_caches[{i}]", t) for i, t in enumerate(kv)])
        except ValueError:
            self.pools.clear()  # all or nothing: a later sleep must not run on half of the tensors
            raise

    def _check_supported(self) -> None:
        """Refuse, before freeing anything, what a sleep would leave pointing at freed memory."""
        if getattr(self.worker.vllm_config, "kv_transfer_config", None) is not None:
            raise RuntimeError("sleep mode cannot free the KV cache of an engine with a KV connector: the connector "
                               "registered the cache's addresses, which a sleep changes. Run without "
                               "--kv-transfer-config to use sleep mode.")
        chosen = next((r.chosen for r in self.worker.model_runner.kernel.records if r.family == "graph"), None)
        if chosen is not None and chosen not in ADDRESS_FREE_GRAPH_MODES:
            raise RuntimeError(
                f"sleep mode cannot keep graph mode '{chosen}': its captured replays read storage addresses that "
                "a sleep changes. Run with graph mode eager (enforce_eager=True or ASCEND_KERNEL_GRAPH_MODE=eager).")

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level {level!r} is not one a worker handles; allowed: 1, 2 "
                             "(level 0 only pauses the scheduler, in the engine core)")
        self._check_supported()
        self._register()
        self.pools.reserved = None  # measured afresh over this sleep's releases
        freed = self.pools.discard("kv_cache")
        if level == 2:
            freed += self.pools.discard("weights")
        elif not self._weights_stay_on_host:
            freed += self.pools.offload("weights")
        self.level = level
        logger.info("ascend-kernel: sleep level %d freed %.1f MiB of tensor storage (%s)%s", level, freed / 2**20,
                    self.pools.describe(), self._reserved_note(freed))

    def _reserved_note(self, freed: int) -> str:
        """What the device allocator says it gave back (a device provider measures it; a host has no such count)."""
        if self.pools.reserved is None:
            return ""
        before, after = self.pools.reserved
        note = f"; the device allocator's reserved memory went {before / 2**20:.1f} -> {after / 2**20:.1f} MiB"
        if freed and after >= before:
            logger.warning("ascend-kernel: sleep freed %.1f MiB of tensors but the device allocator still reserves "
                           "%.1f MiB: the memory did not go back to the device", freed / 2**20, after / 2**20)
        return note

    def wake_up(self, tags: list[str] | None = None) -> None:
        for tag in (self.pools.tags() if tags is None else tags):
            self.pools.restore(tag)
        if all(self.pools.state(t) == "resident" for t in self.pools.tags()):
            self.level = None

    def discard(self, tags: tuple[str, ...]) -> None:
        """vLLM's ``release_kv_cache_memory`` and the like: refused as a sleep is, before anything is freed."""
        self._check_supported()
        self._register()
        for tag in tags:
            self.pools.discard(tag)

    def describe(self) -> dict[str, Any]:
        return {"level": self.level, "provider": type(self.pools).__name__, "pools": self.pools.describe()}

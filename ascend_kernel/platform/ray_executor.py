"""vLLM's Ray executor (V2) for the CPU-fallback platform: one worker per CPU bundle.

Why the CPU platform cannot just declare a ``ray_device_key`` and stop there
(vLLM 0.32, Ray 2.60; each fact is checked in ``tests/test_ray_cpu.py``):

* vLLM builds its placement group as one bundle ``{ray_device_key: 1}`` per
  worker and places worker *i* in bundle *i*. The honest resource of a CPU
  worker is Ray's built-in ``CPU`` (a worker bound to one core holds one
  CPU), so the CPU platform's key is ``"CPU"``: ``ray start --num-cpus N``
  offers N worker slots per node, and no custom resource has to be declared.
* vLLM then asks Ray for the actor with ``num_cpus=0`` and
  ``resources={ray_device_key: 1}``. Ray refuses ``CPU`` inside
  ``resources`` ("Use the 'num_cpus' ... keyword"). :meth:`_get_actor_resource_kwargs`
  therefore asks for nothing more: the bundle already holds the core, and the
  bundle index pins the actor to its node.
* Each worker reports its device ids as
  ``ray.get_runtime_context().get_accelerator_ids()[ray_device_key]``. That
  table holds only Ray's accelerator names (GPU, TPU, NPU, ...): ``CPU`` and
  any custom resource name raise KeyError. A custom name would fail there
  too, which is why no name alone can work. :class:`KernelCpuRayWorkerProc`
  answers with no device ids: a CPU worker has none to isolate.
* A Ray actor process resolves vLLM's platform from its own environment,
  before vLLM hands it the driver's variables. The ``ASCEND_KERNEL_*``
  settings of the driver travel in the actors' runtime environment, so every
  worker runs the kernel's platform with the driver's settings.

vLLM's V2 executor creates its worker actors from the module global
``RayWorkerProc``; :meth:`KernelCpuRayExecutor._init_executor` points that
global at the subclass for the duration of the start-up only (the executor
starts once per engine, in one thread) and puts it back.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from vllm.v1.executor import ray_executor_v2
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2, RayWorkerProc

#: the Ray resource one CPU worker holds (its placement-group bundle); see the module docstring
CPU_RAY_RESOURCE = "CPU"


class KernelCpuRayWorkerProc(RayWorkerProc):
    """vLLM's Ray worker, reporting no device ids (Ray keeps none for CPUs)."""

    def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), []


def _worker_class(cls: type[RayWorkerProc]) -> Any:
    """vLLM's executor module builds ``cls`` as its worker actor inside the block (its own class again after)."""
    from ascend_kernel.scoped import attributes_swapped

    return attributes_swapped((ray_executor_v2, "RayWorkerProc", cls))


class KernelCpuRayExecutor(RayExecutorV2):
    """``--distributed-executor-backend ray`` on the CPU-fallback platform (set by its config check)."""

    @staticmethod
    def _get_actor_resource_kwargs() -> dict[str, Any]:
        # vLLM passes num_cpus=0 itself; Ray forbids "CPU" in resources=. The bundle holds the core.
        return {"num_gpus": 0}

    def _build_runtime_env(self) -> dict:
        runtime_env = super()._build_runtime_env()
        kernel_vars = {k: v for k, v in os.environ.items() if k.startswith("ASCEND_KERNEL_")}
        runtime_env.setdefault("env_vars", {}).update(kernel_vars)
        return runtime_env

    def _init_executor(self) -> None:
        with _worker_class(KernelCpuRayWorkerProc):
            super()._init_executor()

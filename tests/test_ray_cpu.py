"""Why the CPU platform needs more than a ``ray_device_key`` for vLLM's Ray executor, and what it adds.

No Ray cluster is started here: Ray checks actor options when they are
given, and its accelerator table is a plain function. The end-to-end runs
(a two-node Ray cluster on loopback) are in ``tests/e2e/test_ray.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")


class _Actor:
    pass


def test_ray_refuses_cpu_as_a_custom_resource():
    """vLLM asks for ``resources={ray_device_key: 1}`` next to ``num_cpus=0``; with the key ``CPU`` Ray says no."""
    with pytest.raises(ValueError, match="num_cpus"):
        ray.remote(_Actor).options(num_cpus=0, num_gpus=0, resources={"CPU": 1.0})


def test_rays_accelerator_table_has_no_cpu_and_no_custom_names():
    """vLLM's workers look their key up in this table: ``CPU`` or a custom name would be a KeyError."""
    from ray._private.accelerators import get_all_accelerator_resource_names

    names = get_all_accelerator_resource_names()
    assert "CPU" not in names and "ascend_kernel_cpu" not in names
    assert "NPU" in names and "GPU" in names  # what the NPU platform (and CUDA) use


def test_cpu_platform_declares_ray_cpu_and_the_kernel_executor_asks_ray_for_valid_options():
    from ascend_kernel.platform.cpu import KernelCpuPlatform
    from ascend_kernel.platform.ray_executor import CPU_RAY_RESOURCE, KernelCpuRayExecutor

    assert KernelCpuPlatform.ray_device_key == CPU_RAY_RESOURCE == "CPU"
    kwargs = KernelCpuRayExecutor._get_actor_resource_kwargs()
    ray.remote(_Actor).options(num_cpus=0, **kwargs)  # what vLLM passes, plus ours: accepted
    assert "resources" not in kwargs


def test_worker_class_is_swapped_only_during_start_up():
    from vllm.v1.executor import ray_executor_v2

    from ascend_kernel.platform.ray_executor import KernelCpuRayWorkerProc, _worker_class

    original = ray_executor_v2.RayWorkerProc
    with pytest.raises(RuntimeError), _worker_class(KernelCpuRayWorkerProc):
        assert ray_executor_v2.RayWorkerProc is KernelCpuRayWorkerProc
        raise RuntimeError("start-up failed")
    assert ray_executor_v2.RayWorkerProc is original


def test_kernel_settings_travel_in_the_workers_runtime_env(monkeypatch):
    from ascend_kernel.platform.ray_executor import KernelCpuRayExecutor

    monkeypatch.setenv("ASCEND_KERNEL_DEVICE", "cpu")
    monkeypatch.setenv("ASCEND_KERNEL_ATTENTION_BACKEND", "ascend")
    executor = object.__new__(KernelCpuRayExecutor)  # only the runtime-env builder is exercised
    executor.parallel_config = SimpleNamespace(ray_runtime_env=None, ray_workers_use_nsight=False)
    env_vars = executor._build_runtime_env()["env_vars"]
    assert env_vars["ASCEND_KERNEL_DEVICE"] == "cpu" and env_vars["ASCEND_KERNEL_ATTENTION_BACKEND"] == "ascend"

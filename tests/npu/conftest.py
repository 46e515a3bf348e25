"""The stand-in NPU for every test here, and a fresh fake ``torch_npu`` per test (see :mod:`npu.standin`)."""

from __future__ import annotations

import sys

import pytest

# imported before any test puts the fake torch_npu in sys.modules: these look for torch_npu at import time
# (accelerate, through vLLM's model loading) and would take the fake for a real NPU stack for the whole process
import ascend_kernel_plugins.quantization.int8_experts  # noqa: F401,E402
import ascend_kernel_plugins.quantization.int8_linear  # noqa: F401,E402

from npu import fake_torch_npu
from npu.standin import STANDIN


@pytest.fixture
def torch_npu(monkeypatch):
    """The fake torch_npu as ``import torch_npu`` finds it; its call log starts empty."""
    from ascend_kernel import device

    module = fake_torch_npu.make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    fake_torch_npu.CALLS.clear()
    fake_torch_npu.FORMATS.clear()
    device._torch_npu.cache_clear()  # the seam caches the import; this test's module must be the one it finds
    yield module
    device._torch_npu.cache_clear()


@pytest.fixture
def npu_ops(torch_npu):
    """The kernel's torch_npu provider, over the fake."""
    from ascend_kernel.ops.npu import TorchNpuOps

    return TorchNpuOps()


@pytest.fixture
def standin_module():
    STANDIN.calls.clear()
    STANDIN.reserved = 0
    return STANDIN

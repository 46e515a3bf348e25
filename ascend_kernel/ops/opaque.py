"""Seam ops as torch custom ops, so a compiled model sees one opaque call per op on every provider.

Why: under vLLM's default compilation Dynamo traces the model's forward. The
MoE ops have data-dependent shapes (how many rows routing keeps) and the
readable implementations read counts on the host; traced, either fails the
whole graph. Registered as ``torch.library`` ops with fake (shape-only)
implementations, each op is a single node Dynamo never looks inside.

One op per seam op, shared by the providers: its first argument is the
provider's *handle* (its name, a constant in a traced graph), and the op runs
that provider's own method eagerly. So the torch_npu provider (or a stand-in
for torch_npu in a test) and the reference provider go through the same
registered op, and an op's fake is written once, from the seam's contract.

Usage, in a provider class::

    @seam_op("swiglu")
    def swiglu(self, x): ...   # the readable eager body

While Dynamo traces, or under a dispatch mode (fake tensors, a recording
stand-in for device graphs), the decorated method calls
``torch.ops.ascend_kernel.swiglu(handle, x)`` (one opaque op); run plainly
eagerly, it calls the body directly (the op would run the same body, a few
microseconds later). ``method.eager`` is the original body.

``seam_op(..., traceable=True)`` marks a body Dynamo can trace (no host
reads, no data-dependent shapes). Under compilation on a CPU provider
(:data:`CPU_PROVIDERS`) such a body is traced in place of the opaque call, so
inductor fuses across it (the MoE layer's gating and vLLM-CPU's fused expert
kernel: stock vLLM-CPU traces the same computation). The NPU provider always
stays one opaque op: its kernels are what the graph must call.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.compiler import is_compiling

from ascend_kernel.ops import moe_fakes
from ascend_kernel.upstream import dispatch_mode_depth

_dispatch_modes = dispatch_mode_depth  # > 0 while a TorchDispatchMode is active
_LIB = torch.library.Library("ascend_kernel", "FRAGMENT")  # noqa: TOR901 - a namespace of our own
_PROVIDERS: dict[str, Any] = {}
_DEFINED: set[str] = set()
#: providers whose traceable bodies Dynamo traces (pure torch, or vLLM-CPU's own ops with fakes); never torch_npu
CPU_PROVIDERS = frozenset({"reference", "cpu_fused"})


def provider_handle(provider: Any) -> str:
    """The key an op uses to find ``provider`` again: its ``name``, stable across processes.

    A traced graph keeps the key as a constant, and vLLM caches compiled
    graphs on disk, so the key must mean the same provider in the next
    process: the first provider of a name gets the bare name; another live
    provider of the same name (a test's second stand-in) gets ``name#2``...
    """
    handle = getattr(provider, "_seam_handle", None)
    if handle is not None and _PROVIDERS.get(handle) is provider:
        return handle
    # first use in this process (a provider unpickled in a worker carries its old key, unregistered here)
    base = str(getattr(provider, "name", type(provider).__name__))
    handle, n = base, 1
    while _PROVIDERS.get(handle) not in (None, provider):
        n += 1
        handle = f"{base}#{n}"
    _PROVIDERS[handle] = provider
    provider._seam_handle = handle
    return handle


def provider_for(handle: str) -> Any:
    """The provider a handle from :func:`provider_handle` names in this process (for a plugin's own op)."""
    return _PROVIDERS[handle]


@functools.cache
def _eager_body(owner_cls: type, op_name: str) -> Callable[..., Any]:
    """The readable body a provider class routes through op ``op_name`` (its method may have another name)."""
    for klass in owner_cls.__mro__:
        for attr in vars(klass).values():
            if getattr(attr, "seam_op_name", None) == op_name:
                return attr.eager
    raise TypeError(f"{owner_cls.__qualname__} has no method routed through ascend_kernel::{op_name}")


def define_op(name: str, schema: str, fake: Callable[..., Any]) -> None:
    """Register ``ascend_kernel::name(str provider, <schema args>)`` with its fake; once per process."""
    if name in _DEFINED:
        return
    _LIB.define(f"{name}(str provider, {schema}")

    def impl(provider: str, *args: Any) -> Any:
        owner = _PROVIDERS[provider]
        return _eager_body(type(owner), name)(owner, *args)

    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"ascend_kernel::{name}", lambda provider, *args: fake(*args), lib=_LIB)
    _DEFINED.add(name)


def define_op_once(name: str, schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Register a plugin's own opaque op ``ascend_kernel::name(<schema>`` (no provider handle); once per process.

    For a step that must stay out of traced graphs as a whole (the MoE
    layer's routed experts); a plain ``torch.library`` op costs less per call
    than ``torch.library.custom_op``'s wrapper.
    """
    if name in _DEFINED:
        return
    _LIB.define(f"{name}({schema}")
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"ascend_kernel::{name}", fake, lib=_LIB)
    _DEFINED.add(name)


def seam_op(name: str, schema: str | None = None, fake: Callable[..., Any] | None = None, *,
            traceable: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Route a provider method through the registered op ``name``.

    The seam's ops are defined in :mod:`.moe_fakes`; a plugin may define its
    own by giving the schema (arguments after the handle) and the fake.
    ``traceable``: while Dynamo compiles, a provider in :data:`CPU_PROVIDERS`
    runs the body itself (Dynamo traces it) instead of the opaque op.
    """
    if schema is None:
        for known, (known_schema, known_fake) in moe_fakes.SCHEMAS.items():
            define_op(known, known_schema, known_fake)
    else:
        assert fake is not None, f"op {name} needs a fake implementation"
        define_op(name, schema, fake)
    op = getattr(torch.ops.ascend_kernel, name)

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: Any, *args: Any) -> Any:
            if not is_compiling() and not _dispatch_modes():  # plain eager: the body, no trip through the dispatcher
                return method(self, *args)
            if traceable and is_compiling() and getattr(self, "name", None) in CPU_PROVIDERS:
                return method(self, *args)  # Dynamo traces the body: inductor sees (and fuses) what it computes
            return op(provider_handle(self), *args)

        call.eager = method  # type: ignore[attr-defined]
        call.seam_op_name = name  # type: ignore[attr-defined]
        call.traceable = traceable  # type: ignore[attr-defined]
        return call

    return wrap

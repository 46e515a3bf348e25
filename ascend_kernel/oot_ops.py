"""Registering plugin classes as vLLM out-of-tree replacements of its custom ops, once per process.

vLLM instantiates a ``CustomOp`` (or ``PluggableLayer``) through its
out-of-tree registry when a class of the same name is registered there, so a
plugin replaces every instance a model builds by registering before the model
is built. Registration is per process and permanent: registering the same
class again is a no-op, and a different class already there is an error naming
both, with the way out (``remedy``), rather than a silent second winner.
"""

from __future__ import annotations


def register_oot(name: str, cls: type, remedy: str) -> None:
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    present = op_registry_oot.get(name)
    if present is None:
        CustomOp.register_oot(cls, name=name)
    elif present is not cls:
        raise RuntimeError(
            f"vLLM's out-of-tree op '{name}' is already registered as {present.__module__}.{present.__qualname__}; "
            f"{cls.__module__}.{cls.__qualname__} cannot replace it ({remedy})")

"""torch_npu's private names and vLLM-Ascend's ``_C_ascend`` ops: every call the kernel makes matches upstream.py.

``ascend_kernel/upstream.py`` declares each vendor private name with its
parameters (:data:`~ascend_kernel.upstream.VENDOR_NAMES`). A static scan of
``ascend_kernel/`` and ``plugins/`` finds every ``_npu_*`` call, every call of
a declared public torch_npu name (the fused matmul-collective kernels), every
``_C_ascend`` op call and every ``_weak_ref_tensor`` read: each must be
declared, pass only declared keywords and no more positional arguments than
declared; every declaration must still be used. The ``_C_ascend`` stand-ins
the tests register must have the declared schemas, and where torch_npu is
installed (an NPU host) its ops are checked against the declarations too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from ascend_kernel import upstream

ROOT = Path(__file__).resolve().parents[2]
FILES = [p for d in ("ascend_kernel", "plugins") for p in sorted((ROOT / d).rglob("*.py"))
         if p.name != "upstream.py"]


#: the public torch_npu names declared as well (their calls are found by name, as the ``_npu_*`` ones by prefix)
PUBLIC = {n.target.partition(":")[2] for n in upstream.VENDOR_NAMES
          if n.target.startswith("torch_npu:") and not n.target.partition(":")[2].startswith("_")}


def _calls() -> list[tuple[str, str, ast.Call]]:
    """(target, where, call) for every vendor private call in the kernel's source."""
    found = []
    for path in FILES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr, owner = node.func.attr, ast.unparse(node.func.value)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if attr.startswith("_npu_") or attr in PUBLIC:
                found.append((f"torch_npu:{attr}", where, node))
            elif owner in ("_kernels()", "torch.ops._C_ascend"):
                found.append((f"torch.ops._C_ascend:{attr}", where, node))
    return found


def _weak_ref_reads() -> list[str]:
    return [f"{p.relative_to(ROOT)}" for p in FILES if "_weak_ref_tensor" in p.read_text()]


def test_every_vendor_call_matches_its_declaration():
    calls = _calls()
    assert len(calls) >= 12, "the scan found too few calls: it no longer sees the providers' code"
    for target, where, call in calls:
        declared = upstream.vendor_name(target)  # KeyError names the undeclared one
        keywords = {k.arg for k in call.keywords if k.arg is not None}
        assert keywords <= set(declared.params), f"{where}: {target} called with {keywords - set(declared.params)}"
        assert len(call.args) <= len(declared.params), f"{where}: {target} called with {len(call.args)} positionals"


def test_every_declaration_is_used():
    used = {target for target, _, _ in _calls()}
    if _weak_ref_reads():
        used.add("torch_npu._C:_weak_ref_tensor")
    stale = [n.target for n in upstream.VENDOR_NAMES if n.target not in used]
    assert not stale, f"declared in upstream.VENDOR_NAMES but no longer used: {stale}"


def test_the_weak_ref_read_is_declared():
    assert _weak_ref_reads() == ["ascend_kernel/device.py"]
    assert upstream.vendor_name("torch_npu._C:_weak_ref_tensor").params == ("tensor",)


def test_the_c_ascend_standins_have_the_declared_schemas():
    import ops.test_lora_npu  # noqa: F401  - registers the stand-ins

    for name in [n for n in upstream.VENDOR_NAMES if n.target.startswith("torch.ops._C_ascend:")]:
        op = getattr(torch.ops._C_ascend, name.target.partition(":")[2])
        assert tuple(a.name for a in op.default._schema.arguments) == name.params, name.target


def test_an_undeclared_name_is_named():
    with pytest.raises(KeyError, match="_npu_new_kernel.*not declared"):
        upstream.vendor_name("torch_npu:_npu_new_kernel")


def test_the_installed_torch_npu_has_the_declared_parameters():
    """On an NPU host only (torch_npu's ``_npu_*`` kernels are torch ops of its ``npu`` namespace)."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        pytest.skip("torch_npu is not installed (no NPU host)")
    import torch_npu  # noqa: F401

    for name in [n for n in upstream.VENDOR_NAMES if n.target.startswith("torch_npu:")]:
        op = getattr(torch.ops.npu, name.target.partition(":")[2])
        params = {a.name for a in op.default._schema.arguments}
        assert set(name.params) <= params, f"{name.target}: torch_npu's schema has {sorted(params)}"


def test_the_fake_torch_npu_takes_the_declared_public_parameters():
    """The fake's fused matmul-collective kernels (written from torch_npu's docs) take what upstream.py declares,
    the same keywords the kernel passes (the first parameter under the docs' name ``input``)."""
    import inspect

    from npu import fake_torch_npu

    for name in sorted(PUBLIC):
        params = list(inspect.signature(getattr(fake_torch_npu, name)).parameters)
        declared = list(upstream.vendor_name(f"torch_npu:{name}").params)
        assert params[1:4] == declared[1:4] and set(declared[4:]) <= set(params), (name, params)

"""The private vLLM/torch names the kernel uses: each declared one exists as declared, and no undeclared one is used.

``ascend_kernel/upstream.py`` declares every private name (what for, the
versions it was checked on, the public alternative). Here:

* every declared name is found in the installed vLLM / torch, with the
  declared parameters for callables (an upgrade that moves one fails here,
  naming it);
* a static scan (``ast``) of ``ascend_kernel/`` and ``plugins/`` finds any
  private vLLM/torch access outside ``upstream.py``. What counts:

  1. importing a private vLLM/torch module or name (``torch.utils._pytree``,
     ``from vllm.x import _y``);
  2. an attribute chain rooted at ``torch``/``vllm`` or at a name imported
     from them with a private link (``torch._dynamo``, ``torch.ops._C``,
     ``KVConnectorFactory._registry``);
  3. ``x._y`` on any other object where no project code defines ``_y``
     (the kernel's own ``_private`` names are defined somewhere in the
     project, so they never trip it);
  4. ``super()._y`` and ``def _y`` overriding a vLLM/torch class's private
     method, unless declared as an override of that class;
  5. ``getattr``/``hasattr``/``setattr`` with a literal private name no project code defines;
  6. ``self._y`` read in a subclass of a vLLM/torch class where the
     project never sets ``_y`` (vLLM's instance attributes).

  Exempt (:data:`EXEMPT_OBJECTS`, :data:`EXEMPT_ATTRIBUTES`): torch_npu's
  ``_npu_*`` kernels and vLLM-Ascend's ``torch.ops._C_ascend`` namespace, the
  vendor libraries' documented entry points, not vLLM/torch names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from ascend_kernel import upstream

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("ascend_kernel", "plugins")
CONTRACT = ROOT / "ascend_kernel" / "upstream.py"
UPSTREAM_ROOTS = ("torch", "vllm")
#: objects whose private-looking attributes are not vLLM's or torch's (source text of the object)
EXEMPT_OBJECTS = {"self._npu", "_torch_npu()", "getattr(_torch_npu(), '_C', None)"}
#: private-looking attribute names that are not vLLM's or torch's: vLLM-Ascend's op namespace (its LoRA kernels,
#: ascend_kernel/ops/lora_npu.py), the vendor extension's documented entry points as torch_npu's ``_npu_*`` are
EXEMPT_ATTRIBUTES = {"_C_ascend"}
#: kernel mixins with no vLLM base in their own bases, and the vLLM class they are mixed into
MIXED_INTO = {"KernelRunnerMixin": "vllm.v1.worker.gpu_model_runner:GPUModelRunner"}


def _resolve(target: str):
    module_name, _, qualname = target.partition(":")
    obj = importlib.import_module(module_name)
    parents = []
    for part in qualname.split(".") if qualname else ():
        parents.append(obj)
        obj = getattr(obj, part)
    return obj, parents


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# -- the declared names exist ---------------------------------------------------------------------------


def test_the_declarations_are_complete_and_distinct():
    targets = [n.target for n in upstream.NAMES]
    assert len(targets) == len(set(targets))
    for name in upstream.NAMES:
        assert name.kind in ("accessor", "override", "text"), name
        assert name.why and name.public, f"{name.target}: say what it is for and the public alternative"
        assert (name.kind == "override") == bool(name.overridden_by), name.target
    assert upstream.CHECKED_ON == {"vllm": "0.32.0", "torch": "2.13.0"}


@pytest.mark.parametrize("name", [n for n in upstream.NAMES if n.kind != "text"], ids=lambda n: n.target)
def test_every_declared_name_exists_as_declared(name):
    if name.instance_attribute:  # set in vLLM's __init__: the class's own source must set it
        module_name, _, qualname = name.target.partition(":")
        owner_path, _, attribute = qualname.rpartition(".")
        owner, _ = _resolve(f"{module_name}:{owner_path}")
        sources = [inspect.getsource(k) for k in owner.__mro__ if k is not object and k.__module__ != "builtins"]
        assert any(f"self.{attribute}" in s for s in sources), \
            f"{name.target}: no class in {owner.__qualname__}'s MRO sets self.{attribute} any more"
        return
    obj, _ = _resolve(name.target)
    if name.params is not None:
        assert callable(obj), f"{name.target} is no longer callable"
        try:
            found = tuple(inspect.signature(obj).parameters)
        except ValueError:  # a C function without a signature: called with no arguments by the kernel
            found = ()
        assert found == name.params, f"{name.target}: parameters {found}, the kernel was written for {name.params}"


@pytest.mark.parametrize("name", [n for n in upstream.NAMES if n.kind == "override"], ids=lambda n: n.target)
def test_every_override_is_where_it_is_declared(name):
    attribute = name.target.rpartition(".")[2]
    for where in name.overridden_by:
        module_name, _, class_name = where.partition(":")
        path = ROOT / ("plugins" if module_name.startswith("ascend_kernel_plugins") else "") / Path(
            *module_name.removeprefix("ascend_kernel_plugins.").split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
        classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        assert class_name in classes, f"{where} is gone"
        assert attribute in {f.name for f in classes[class_name].body if isinstance(f, ast.FunctionDef)}, \
            f"{where} no longer overrides {attribute}: drop it from upstream.NAMES"


def test_dynamo_names_the_traced_module_l_self():
    """The whole-model capture tells the model's own tensors by Dynamo's names for them (its entry's ``self``)."""
    import torch

    from ascend_kernel_plugins.graph.whole_model import _fresh_entry

    graphs = []

    def catch(gm, example_inputs):
        graphs.append(gm)
        return gm

    model = torch.nn.Linear(4, 3)
    torch.compile(_fresh_entry(), backend=catch, fullgraph=True, dynamic=False)(model, torch.ones(2, 4))
    placeholders = [n for n in graphs[0].graph.nodes if n.op == "placeholder"]
    assert [upstream.dynamo_reached_from_self(n) for n in placeholders] == [True, True, False], \
        [(n.name, n.meta.get("grapharg")) for n in placeholders]


def test_vllm_names_a_missing_worker_method_as_declared():
    from vllm.v1.serial_utils import run_method

    with pytest.raises(NotImplementedError) as info:
        run_method(object(), "ascend_kernel_report", (), {})
    assert upstream.missing_worker_method("ascend_kernel_report") in str(info.value)


def test_the_scoped_dynamo_patch_restores_the_limit():
    before = upstream.dynamo_recompile_limit()
    with upstream.dynamo_config_patch(recompile_limit=before + 5):
        assert upstream.dynamo_recompile_limit() == before + 5
    assert upstream.dynamo_recompile_limit() == before


# -- nothing private outside the contract ----------------------------------------------------------------


def _files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if p != CONTRACT)


def project_private_names(files: list[Path]) -> set[str]:
    """Every ``_name`` the project itself defines (functions, classes, assignments, attributes it sets)."""
    names: set[str] = set()
    for path in files + [CONTRACT]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if _private(n)}


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: Path, own: set[str], overrides: dict[str, set[str]]) -> None:
        self.path, self.own, self.overrides = path, own, overrides
        self.upstream_names: dict[str, str] = {}  # local name -> the vllm/torch object it was imported as
        self.found: list[str] = []
        self.classes: list[tuple[ast.ClassDef, str | None, set[str]]] = []

    def flag(self, node: ast.AST, what: str) -> None:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        self.found.append(f"{where}:{node.lineno}: {what}")

    # imports -----------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] in UPSTREAM_ROOTS:
                if any(_private(p) for p in parts):
                    self.flag(node, f"import {alias.name}")
                local = alias.asname or parts[0]
                self.upstream_names[local] = alias.name if alias.asname else parts[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        parts = module.split(".")
        if node.level == 0 and parts[0] in UPSTREAM_ROOTS:
            for alias in node.names:
                if any(_private(p) for p in parts) or _private(alias.name):
                    self.flag(node, f"from {module} import {alias.name}")
                self.upstream_names[alias.asname or alias.name] = f"{module}:{alias.name}"

    # classes -----------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        upstream_base = MIXED_INTO.get(node.name)
        for base in node.bases:
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.upstream_names:
                upstream_base = upstream_base or self.upstream_names[root.id]
        sets = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        sets |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.classes.append((node, upstream_base, sets))
        if upstream_base is not None:
            base_cls = _base_class(upstream_base)
            for item in node.body:
                if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name)
                        and (base_cls is None or hasattr(base_cls, item.name))
                        and item.name not in self.overrides.get(node.name, set())):
                    self.flag(item, f"{node.name}.{item.name} overrides {upstream_base}'s private method")
        self.generic_visit(node)
        self.classes.pop()

    # attributes --------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            self._check_attribute(node)
        self.generic_visit(node)

    def _check_attribute(self, node: ast.Attribute) -> None:
        base = node.value
        text = ast.unparse(base)
        if text in EXEMPT_OBJECTS or node.attr in EXEMPT_ATTRIBUTES:
            return
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            cls = self.classes[-1][0].name if self.classes else "?"
            if node.attr not in self.overrides.get(cls, set()):
                self.flag(node, f"super().{node.attr} (a vLLM/torch private method not declared as overridden)")
            return
        root = base
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.upstream_names and not (
                isinstance(base, ast.Name) and base.id in ("self", "cls")):
            self.flag(node, f"{ast.unparse(node)} (private name of {self.upstream_names[root.id]})")
            return
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            if self.classes and self.classes[-1][1] is not None and isinstance(node.ctx, ast.Load):
                _, upstream_base, sets = self.classes[-1]
                if node.attr not in sets and node.attr not in self.own:
                    self.flag(node, f"self.{node.attr} (an attribute of {upstream_base} the project never sets)")
            return
        if node.attr not in self.own:
            self.flag(node, f"{ast.unparse(node)} (no project code defines {node.attr})")

    def visit_Call(self, node: ast.Call) -> None:
        if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                and _private(node.args[1].value) and node.args[1].value not in self.own
                and ast.unparse(node.args[0]) not in EXEMPT_OBJECTS):
            self.flag(node, f"{node.func.id}(..., {node.args[1].value!r}) (no project code defines it)")
        self.generic_visit(node)


def _base_class(target: str):
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, name) if name else None
    except Exception:  # noqa: BLE001 - not importable here: every private def in the class is flagged
        return None


def _declared_overrides() -> dict[str, set[str]]:
    overrides: dict[str, set[str]] = {}
    for name in upstream.NAMES:
        for where in name.overridden_by:
            overrides.setdefault(where.partition(":")[2], set()).add(name.target.rpartition(".")[2])
    return overrides


def scan(files: list[Path]) -> list[str]:
    own = project_private_names(files)
    overrides = _declared_overrides()
    found: list[str] = []
    for path in files:
        scanner = _Scanner(path, own, overrides)
        scanner.visit(ast.parse(path.read_text(), str(path)))
        found += scanner.found
    return found


def scan_elsewhere(files: list[Path]) -> list[str]:
    """:func:`scan` in a process of its own: it imports the vLLM base classes of the scanned classes (some import
    numba), and vLLM's own module scans trip over what those leave in ``sys.modules`` in later tests."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, __file__, *map(str, files)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_scan_flags_what_it_should(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n"
        "import torch._dynamo\n"
        "from torch.utils._pytree import tree_map\n"
        "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
        "x = torch._C._len_torch_dispatch_stack()\n"
        "names = KVConnectorFactory._registry\n"
        "def f(parser):\n"
        "    return parser._actions, getattr(torch.cpu, '_is_amx_tile_supported', None)\n"
        "class R(GPUModelRunner):\n"
        "    def _sample(self, logits, meta):\n"
        "        return super()._sample(logits, meta), self._kernel_own, self.input_batch\n"
        "    def go(self):\n"
        "        self._kernel_own = 1\n"
        "        return self._prepare_inputs, self._hidden_vllm_attribute\n"
        "def own(thing):\n"
        "    thing._kernel_handle = 1\n"
        "    return thing._kernel_handle\n")
    found = "\n".join(scan_elsewhere([sample]))
    for expected in ("import torch._dynamo", "torch.utils._pytree", "torch._C", "KVConnectorFactory._registry",
                     "parser._actions", "'_is_amx_tile_supported'", "R._sample overrides", "super()._sample",
                     "self._hidden_vllm_attribute", "self._prepare_inputs"):
        assert expected in found, f"{expected} not flagged:\n{found}"
    for clean in ("_kernel_own", "_kernel_handle", "input_batch"):
        assert clean not in found, f"{clean} flagged:\n{found}"


def test_no_private_vllm_or_torch_access_outside_the_contract():
    found = scan_elsewhere(_files())
    assert not found, ("private vLLM/torch names used outside ascend_kernel/upstream.py: reach each through an "
                       "accessor declared there (or declare the override), with what it is for and the public "
                       "alternative:\n" + "\n".join(found))


if __name__ == "__main__":  # scan_elsewhere's child: scan the given files, print the findings as one JSON line
    import json
    import sys

    print(json.dumps(scan([Path(p) for p in sys.argv[1:]])))

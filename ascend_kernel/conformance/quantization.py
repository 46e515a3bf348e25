"""Contract of the ``quantization`` family (interface; what runs is checked end to end).

* ``interface``: the built object names the vLLM quantization ``format`` it
  serves (None for a pass-through of vLLM's own configs) and ``describe()``
  returns a dict for the report.
* ``changes-what-runs``: it has a way to act on the model: ``method_for(config,
  layer, prefix)`` (formats whose vLLM config asks the chosen implementation
  for each layer's method) or ``prepare_model(vllm_config)`` (installs its own
  config before the model is built). A pass-through (``format`` None) needs
  neither.

Which kernels a layer then runs, and that they equal stock vLLM on the same
weights, needs a real checkpoint and engine: ``tests/e2e/test_quantization.py``.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "quantization"
CONFIGS = ("llama-ascend-quant", "llama-compressed-tensors")


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    _, obj = built[0]

    def interface() -> str:
        fmt = getattr(obj, "format", "missing")
        assert fmt is None or isinstance(fmt, str), f"format must be a vLLM quantization name or None, not {fmt!r}"
        described = obj.describe()
        assert isinstance(described, dict), f"describe() returned {type(described).__name__}, not a dict"
        return f"format {fmt!r}; describe() keys {sorted(described)}"

    def changes_what_runs() -> str:
        if getattr(obj, "format", None) is None:
            return "pass-through of vLLM's own quantization configs"
        hooks = [name for name in ("method_for", "prepare_model") if callable(getattr(obj, name, None))]
        assert hooks, "a format implementation needs method_for(config, layer, prefix) or prepare_model(vllm_config)"
        return ", ".join(hooks)

    checks.run("interface", interface)
    checks.run("changes-what-runs", changes_what_runs)

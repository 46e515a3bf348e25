"""Contract of the ``rejection_sampler`` family (interface only).

* ``interface``: under a speculative config, the built object's
  ``build(sampler, vllm_config, device)`` returns a callable module (given
  vLLM's own ``Sampler``). Its verification needs draft tokens and logits
  laid out by a running engine's spec-decode metadata, so the kit does not
  call it.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "rejection_sampler"
CONFIGS = ("llama-ngram",)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    found, obj = built[0]

    def interface() -> str:
        from vllm.v1.sample.sampler import Sampler

        build = getattr(obj, "build", None)
        assert callable(build), f"{type(obj).__name__} has no build(sampler, vllm_config, device) method"
        module = build(Sampler(), found.ctx.vllm_config, torch.device("cpu"))
        assert callable(module), f"build(...) returned {type(module).__name__}, which is not callable"
        return f"build(sampler, vllm_config, device) -> {type(module).__name__} (verification itself needs an engine)"

    checks.run("interface", interface)

"""Contract of the ``attention_mask`` family (interface only).

* ``interface``: the built object has a callable
  ``mask_for(state, seq_lens, positions, dtype, device)``. What a mask must
  hold depends on the attention backend that reads it, so the kit does not
  check the masks themselves.
"""

from __future__ import annotations

import inspect
from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "attention_mask"
CONFIGS = ("llama",)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    _, builder = built[0]

    def interface() -> str:
        mask_for = getattr(builder, "mask_for", None)
        assert callable(mask_for), f"{type(builder).__name__} has no mask_for(...) method"
        try:
            inspect.signature(mask_for).bind(None, None, None, None, None)
        except TypeError as exc:
            raise AssertionError(f"mask_for cannot take (state, seq_lens, positions, dtype, device): {exc}") from exc
        except ValueError:
            pass  # no signature to read (a builtin): accepted
        return "mask_for(state, seq_lens, positions, dtype, device); masks themselves are the backend's concern"

    checks.run("interface", interface)

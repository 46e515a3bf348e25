"""A third-party graph pass, ``rows-rms-norm``: the seam's token-row ``rms_norm`` swapped for this package's op.

One file and one entry point (``ak_fusion_plugin-1.0.dist-info`` beside it declares
``[ascend_kernel.plugins] fusion-demo = ak_fusion_plugin``; put ``tests/thirdparty/fusion`` on ``PYTHONPATH``).
Nothing in the kernel knows either name. It shows what a vendor with a faster kernel of its own does: register
the op with ``torch.library`` (here ``ak_fusion::rms_norm_rows``, plain torch maths) and offer a pass in the
``fusion_pass`` family that puts it where the traced graph calls the seam's op. The kernel's pass manager runs it
in every compile the kernel makes, after the built-in passes (its priority is lower), and the engine's report
lists it with its matches.

The pass takes only ``rms_norm`` over token rows (a 2-D input). Per-head norms (Qwen3's q/k norms, 3-D) are
the built-in qknorm-rope pass's; one that pass left (a rotary it could not fuse) is counted as skipped, with why.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import fx

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

NAME = "rows-rms-norm"

_LIB = torch.library.Library("ak_fusion", "DEF")  # noqa: TOR901 - a test plugin's own namespace
_LIB.define("rms_norm_rows(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)")


def _rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / rms(x) * weight, 1 / rms(x)) over the last dimension in float32, cast back: the seam op's contract."""
    wide = x.float()
    rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (wide * rstd * weight.float()).to(x.dtype), rstd


_LIB.impl("rms_norm_rows", _rms_norm_rows, "CompositeExplicitAutograd")
torch.library.register_fake("ak_fusion::rms_norm_rows", lambda x, weight, eps: (
    torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)), lib=_LIB)


class RowsRmsNormPass:
    """``ascend_kernel::rms_norm(provider, x, w, eps)`` over 2-D ``x``  =>  ``ak_fusion::rms_norm_rows(x, w, eps)``."""

    name = NAME

    def __init__(self) -> None:
        self.matches = 0
        self.skipped: Counter[str] = Counter()

    def __call__(self, graph: fx.Graph) -> int:
        seam = torch.ops.ascend_kernel.rms_norm.default
        found = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not seam:
                continue
            _, x, weight, eps = node.args
            value = x.meta.get("val") if isinstance(x, fx.Node) else None
            if value is None:
                self.skipped["the input carries no traced value (not a traced graph)"] += 1
                continue
            if value.dim() != 2:
                self.skipped["a per-head norm (not token rows): the qknorm-rope pass's"] += 1
                continue
            with graph.inserting_before(node):
                swapped = graph.call_function(torch.ops.ak_fusion.rms_norm_rows.default, (x, weight, eps))
            # its value only: the old node's other meta (inductor's ``eager_input_vals``) is the seam op's
            # arguments, which inductor would normalise against this op's schema and fail
            swapped.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(swapped)
            graph.erase_node(node)
            found += 1
        self.matches += found
        return found

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "enabled": True, "matches": self.matches, "skipped": dict(self.skipped)}


def _seam_norms(ctx: Any) -> str | None:
    if ctx.settings.forced("layer_ops") == "ascend" or ctx.device.kind == "npu":
        return None
    return "no seam rms_norm in the graph: the model runs vLLM's own layers (ASCEND_KERNEL_LAYER_OPS=ascend)"


@hookimpl
def ascend_kernel_fusion_passes() -> list[Implementation]:
    return [Implementation(family="fusion_pass", name=NAME, factory=lambda ctx: RowsRmsNormPass(),
                           supports=_seam_norms, priority=-10,
                           description="the seam's token-row rms_norm -> ak_fusion::rms_norm_rows (third party)")]

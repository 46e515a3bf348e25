"""Contract of the ``fusion_pass`` family: a pass rewrites a graph without changing what it computes.

The built pass is given a small traced graph (the seam's reference ops and
aten, as a post-grad graph holds them) that contains every pattern the
built-in passes know: an add + RMSNorm feeding a static and a dynamic
quantize, per-head q/k norms feeding the rotary, and ``x * s + y``; and a
plain RMSNorm over token rows (a first layer's input norm, which no built-in
pass takes but a third party's may). It must:

* ``same-values``: return how many patterns it replaced (an int, added to its
  ``matches``), leave a graph that lints, and compute the same outputs as the
  untouched graph (bit for bit: a fused op is the composition it replaces);
* ``describes``: report ``{name, enabled, matches, ...}`` for the report's ``fusion`` list.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "fusion_pass"
CONFIGS = ("llama", "deepseek_v2", "deepseek_v2-scaled")  # the last for muls-add: a routed scale of 2.0


def _program(ops: Any, scale: float) -> Any:
    def program(x, residual, weight, inv_scale, offset, qkv, positions, q_weight, k_weight, cache):
        first = ops.rms_norm(x, weight, 1e-6)[0]
        normed, summed = ops.add_rms_norm(x, residual, weight, 1e-6)
        static = ops.quantize(normed, inv_scale, offset)
        normed2, summed2 = ops.add_rms_norm(summed, x, weight, 1e-5)
        dynamic, row_scale = ops.dynamic_quant(normed2)
        q, k, v = qkv.split([32, 16, 16], dim=-1)
        q = ops.rms_norm(q.view(-1, 4, 8), q_weight, 1e-6)[0].view(q.shape)
        k = ops.rms_norm(k.view(-1, 2, 8), k_weight, 1e-6)[0].view(k.shape)
        q, k = ops.rope(positions, q, k, 8, cache, True)
        return static, dynamic, row_scale, summed2, q, k, v, summed * scale + x, first
    return program


def _inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    angles = torch.arange(16).float()[:, None] * inv[None]
    return (torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen), torch.randn(16, generator=gen),
            torch.full((1,), 20.0), torch.zeros(1), torch.randn(3, 64, generator=gen), torch.tensor([0, 3, 9]),
            torch.randn(8, generator=gen), torch.randn(8, generator=gen), torch.cat([angles.cos(), angles.sin()], -1))


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    _, fusion = built[0]
    from torch.fx.experimental.proxy_tensor import make_fx

    from ascend_kernel.ops import get_ops

    def same_values() -> str:
        inputs = _inputs()
        scale = getattr(fusion, "scale", None) or 2.0
        gm = make_fx(_program(get_ops("reference", "cpu"), scale), tracing_mode="fake")(*inputs)
        unfused = copy.deepcopy(gm)
        before = getattr(fusion, "matches", 0)
        found = fusion(gm.graph)
        assert isinstance(found, int) and found >= 0, f"returned {found!r}, not a count"
        assert fusion.matches == before + found, f"matches {fusion.matches} after {before} + {found}"
        gm.graph.lint()
        gm.recompile()
        for i, (a, b) in enumerate(zip(gm(*inputs), unfused(*inputs))):
            assert torch.equal(a, b), f"output {i} differs after the rewrite"
        return f"{found} pattern(s) replaced, outputs equal to the unfused graph"

    checks.run("same-values", same_values)

    def describes() -> str:
        report = fusion.describe()
        missing = {"name", "enabled", "matches"} - set(report)
        assert not missing, f"describe() lacks {sorted(missing)}"
        return f"{report['name']}: enabled={report['enabled']}, matches={report['matches']}"

    checks.run("describes", describes)

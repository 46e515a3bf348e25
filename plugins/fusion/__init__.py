"""Graph fusion passes over the seam ops (family ``fusion_pass``).

Public surface: the pass classes (:data:`PASSES`, by name) and the settings
model. The pass manager that runs them lives with the seam
(:mod:`ascend_kernel.ops.pass_manager`), which the platforms name.
"""

from __future__ import annotations

from ascend_kernel_plugins.fusion.passes import PASSES, FusionPass
from ascend_kernel_plugins.fusion.settings import FusionSettings

__all__ = ["PASSES", "FusionPass", "FusionSettings"]

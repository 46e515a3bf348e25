"""Tensor-parallel communication (family ``tp_comm``): all-reduce, or sequence parallel per forward pass.

Public surface: the choice's names and the per-pass record the layers read from
vLLM's forward context (``"tp_comm"``), and the decision function. The layers
that carry the mechanism (the seam's norm and row-parallel linear) live with
the ``layers`` family; the collectives with the ops seam.
"""

from __future__ import annotations

from ascend_kernel_plugins.tp_comm.policy import (
    ALL_REDUCE, SEQUENCE_PARALLEL, STEP_COUNTER, SequenceParallelPass, choose, min_tokens_for,
)
from ascend_kernel_plugins.tp_comm.settings import TpCommSettings

__all__ = ["ALL_REDUCE", "SEQUENCE_PARALLEL", "STEP_COUNTER", "SequenceParallelPass", "TpCommSettings", "choose",
           "min_tokens_for"]

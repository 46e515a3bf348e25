"""Models for tests, demos and benchmarks: tiny random-weight ones per family, and one real model.

Not part of the kernel: nothing under ``ascend_kernel`` outside the CLI imports
this package. The kernel's end-to-end tests, ``make demo`` and the benches use
it to get models offline (the hosts have no model hub).
"""

from __future__ import annotations

from ascend_kernel.models.tiny import SUPPORTED_ARCHS, SUPPORTED_DTYPES, create_tiny_model, tiny_model_cache_dir

__all__ = ["SUPPORTED_ARCHS", "SUPPORTED_DTYPES", "create_tiny_model", "tiny_model_cache_dir"]

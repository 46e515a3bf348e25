"""Ascend attention backends (vLLM backend interfaces) over the ops seam."""

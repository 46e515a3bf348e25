"""Config fix-ups: reset vLLM options that are GPU-specific or wrong on the target device."""

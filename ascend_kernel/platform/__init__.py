"""vLLM platform classes of the kernel (CPU fallback and NPU) and what they share."""

"""Workers: vLLM's workers, building the kernel runner and answering report RPCs."""

"""The kernel runner: vLLM's V1 runner with its feature seams routed to the chosen plugins."""

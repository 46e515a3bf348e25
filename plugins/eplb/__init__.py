"""Dynamic expert load balancing through vLLM's own EPLB (see docs/families/eplb_policy.md)."""

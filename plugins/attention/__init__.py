"""Attention family: backend choice, per-step attention state, masks."""

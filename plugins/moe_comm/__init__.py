"""MoE communication family: which collective moves tokens to experts, per batch."""

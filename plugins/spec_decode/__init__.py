"""Speculative-decoding family: one drafter per ``speculative_config.method``."""

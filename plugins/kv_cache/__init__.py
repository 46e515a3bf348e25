"""KV-cache family: one layout plugin per KV-cache spec kind."""

"""Model-layer ops (RMSNorm, rotary embedding) as vLLM out-of-tree custom ops over the ops seam."""

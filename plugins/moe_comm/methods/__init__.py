"""MoE communication methods, one plugin module each (family ``moe_comm_method``)."""

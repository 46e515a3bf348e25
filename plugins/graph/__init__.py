"""Graph-capture family: eager, ACL graphs on an NPU, static per-size compiled pieces on a CPU (cpu-graph)."""

"""Graph-capture family: eager, or ACL graphs on an NPU."""

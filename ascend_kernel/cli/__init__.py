"""The ``ascend-kernel`` command line."""

"""Built-in ascend-kernel plugins (installed as ``ascend_kernel_plugins``).

Each sub-package is one feature family; each module named in the
``ascend_kernel.plugins`` entry-point group is one separately registered,
separately disable-able plugin. They use only the kernel's public pieces
(hookspecs, registry, device seam) — exactly what a third-party plugin can use.
"""

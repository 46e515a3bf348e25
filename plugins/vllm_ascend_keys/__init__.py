"""vllm-ascend's configuration as its users write it: every ``additional_config`` key and ``VLLM_ASCEND_*``
variable is mapped onto a kernel setting, honored as what the kernel already does, or refused by name."""

from ascend_kernel_plugins.vllm_ascend_keys.translate import Translation, translate

__all__ = ["Translation", "translate"]

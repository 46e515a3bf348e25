"""Errors the kernel raises. Each one is meant to be read by a person.

They all derive from :class:`KernelError`, so the CLI can print the message as
one paragraph instead of a traceback, and vLLM users see a sentence that names
what was wrong (a setting, a plugin and its entry point, an implementation
name) and what would have been allowed.
"""

from __future__ import annotations


class KernelError(Exception):
    """Base class of every error ascend-kernel raises on purpose."""


class SettingsError(KernelError):
    """A setting (env var or ``additional_config`` key) has a value that is not allowed.

    Deliberately not a ValueError: vLLM's ``VllmConfig`` is a pydantic
    dataclass, and pydantic turns a ValueError raised during its construction
    (where the platform's config check runs) into a ValidationError about
    VllmConfig, burying the message. Any other exception passes through as is.
    """


class UsageError(KernelError):
    """A command-line argument of ``ascend-kernel`` has a value that is not allowed (names the flag)."""


class PluginError(KernelError):
    """A plugin failed to load, or one of its hooks failed; names the plugin and entry point."""


class SelectionError(KernelError):
    """No implementation, an unknown forced name, a priority tie or a name clash in a family."""


class KVCacheAllocationError(KernelError):
    """The KV-cache configuration and the layout plugins disagree (names the layer and numbers)."""

"""The vllm-ascend configuration plugin: its keys become kernel settings at load, and records at configure.

The translation runs inside :func:`ascend_kernel.settings.load_settings` (the settings model's
``from_foreign_config``), in every process that loads the engine's settings, so a refused key stops
``ascend-kernel explain`` before any engine starts, and a worker sees the same settings as the platform. It
runs for an installed plugin whether or not it is enabled: disabling it cannot make a key silently ignored.
The ``ascend_kernel_configure`` hook then records each honored key as a config change, which ``explain`` and
the report show.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from pydantic import BaseModel

from ascend_kernel.config_changes import ConfigChange
from ascend_kernel.errors import SettingsError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.settings import unimplemented_toggles
from ascend_kernel_plugins.vllm_ascend_keys.translate import translate

REASON = "vllm-ascend's configuration, as the kernel runs it"


class VllmAscendKeysSettings(BaseModel):
    """No setting of its own: vllm-ascend's keys map onto the settings the families declare.

    (``enable_flashcomm1`` onto the TP-communication plugin's ``sequence_parallel``; with that plugin not
    installed the key is refused when on.) The model carries the translation (:meth:`from_foreign_config`).
    """

    @classmethod
    def from_foreign_config(cls, additional_config: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
        """The kernel settings vllm-ascend's keys and variables set; a refused one raises SettingsError."""
        result = translate(additional_config, os.environ, implemented(model))
        if result.refusals:
            raise SettingsError(result.message())
        return dict(result.settings)


@hookimpl
def ascend_kernel_settings() -> type[BaseModel]:
    return VllmAscendKeysSettings


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any) -> list[ConfigChange]:
    result = translate(getattr(vllm_config, "additional_config", None), os.environ, implemented(type(settings)))
    return [ConfigChange(_where(o.path), o.value, o.effect, REASON) for o in result.honored]


def implemented(model: type[BaseModel]) -> frozenset[str]:
    """The settings a key may map onto: declared, and not a toggle of a feature no plugin implements."""
    return frozenset(model.model_fields) - set(unimplemented_toggles(model))


def _where(path: str) -> str:
    return path[1:] if path.startswith("$") else f"additional_config.{path}"

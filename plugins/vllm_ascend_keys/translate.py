"""vllm-ascend's configuration (``additional_config`` keys, then ``VLLM_ASCEND_*`` variables) -> kernel settings.

As in vllm-ascend, a key of ``additional_config`` wins over the environment variable it replaces (the variable
is then not read at all). A setting
the user also gives the kernel's way (``additional_config["ascend_kernel"]`` or ``ASCEND_KERNEL_*``) with
another value is a conflict and refused: two names for one thing must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ascend_kernel.settings import ADDITIONAL_CONFIG_KEY, ENV_PREFIX
from ascend_kernel_plugins.vllm_ascend_keys import envs, keys
from ascend_kernel_plugins.vllm_ascend_keys.rules import DOC_PAGE, Outcome, as_bool

HEADLINE = ("vllm-ascend configuration the kernel does not run (each key is honored or refused by name; "
            f"{DOC_PAGE} lists them all):")


@dataclass(frozen=True)
class Translation:
    settings: Mapping[str, Any]
    outcomes: tuple[Outcome, ...]

    @property
    def refusals(self) -> list[str]:
        return [o.refusal for o in self.outcomes if o.refusal]

    @property
    def honored(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.refusal]

    def message(self) -> str:
        return "\n\n".join([HEADLINE, *self.refusals])


def translate(additional_config: Mapping[str, Any] | None, environ: Mapping[str, str],
              fields: frozenset[str]) -> Translation:
    """Every outcome of vllm-ascend's keys and variables, and the kernel settings they set."""
    config = dict(additional_config or {})
    found = envs.outcomes(environ, fields, config) + keys.outcomes(config, fields)
    settings: dict[str, Any] = {}
    for outcome in found:  # the environment's first: additional_config's keys overwrite them
        for name, value in outcome.settings.items():
            root, _, sub = name.partition(".")
            if sub:
                settings.setdefault(root, {})[sub] = value
            else:
                settings[root] = value
    conflicts = [_conflict(name, value, config.get(ADDITIONAL_CONFIG_KEY) or {}, environ)
                 for name, value in settings.items()]
    return Translation(settings, tuple(found) + tuple(
        Outcome(name, settings[name], refusal=text) for name, text in zip(settings, conflicts) if text))


def _conflict(name: str, value: Any, section: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    env = ENV_PREFIX + name.upper()
    for source, given in ((f'additional_config["{ADDITIONAL_CONFIG_KEY}"]["{name}"]', section.get(name)),
                          (env, environ.get(env))):
        if given is None or _same(value, given):
            continue
        return (f"the kernel setting {name} is given twice with different values: {given!r} by {source} and "
                f"{value!r} by vllm-ascend's configuration. Instead: give it one way")
    return ""


def _same(value: Any, given: Any) -> bool:
    if isinstance(value, bool):
        return value == as_bool(given)
    return value == given

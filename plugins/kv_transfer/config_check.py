"""What a ``kv_transfer_config`` may hold, checked before any engine starts: one paragraph naming every problem.

Why the kernel checks it rather than vLLM:

* vLLM parses ``--kv-transfer-config`` inside argparse, so invalid JSON or a
  bad ``kv_role`` ends as argparse's usage line plus pydantic's multi-line
  report;
* an unknown ``kv_connector`` is found only when the engine core builds the
  connector, after the model was loaded;
* Mooncake's transfer engine accepts *any* ``mooncake_protocol`` name and
  quietly uses TCP when it has no transport of that name (checked with
  ``mooncake-transfer-engine-non-cuda`` 0.3.13: ``initialize`` returns 0 for
  ``"bogus"``), so a typo would never be reported.

:func:`check_kv_transfer_config` takes the flag's text and returns the parsed
object or raises :class:`KVTransferConfigError` (a :class:`~ascend_kernel.errors.UsageError`)
naming the flag, the value, what was wrong and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, get_args

from ascend_kernel.errors import UsageError

MOONCAKE = "MooncakeConnector"
#: transports of Mooncake's engine: the two vLLM's MooncakeConnector documents, and Ascend's own transport
#: between NPUs (``mooncake-transfer-engine-npu``, the ``pd-npu`` extra); only tcp is run here
MOONCAKE_PROTOCOLS = ("tcp", "rdma", "ascend")
#: transports that need an NPU on the host
NPU_PROTOCOLS = ("ascend",)


class KVTransferConfigError(UsageError):
    """A ``kv_transfer_config`` refused before anything starts (names the flag, the problem, what is allowed)."""


def mooncake_protocol_problem(extra_config: Mapping[str, Any] | None,
                              subject: str = "kv_connector_extra_config.mooncake_protocol",
                              on_npu: bool | None = None) -> str | None:
    """Why ``kv_connector_extra_config.mooncake_protocol`` is not one the transfer engine has here, or None.

    Unset is allowed (the kernel picks ``ascend`` on an NPU; vLLM's connector
    asks for ``rdma`` elsewhere). ``subject`` names the value in the message (a
    flag of its own in ``serve-pd``). ``on_npu``: whether this host has an
    NPU (None: not known yet, as when a CLI flag is read; only the name is checked).
    """
    protocol = (extra_config or {}).get("mooncake_protocol")
    if protocol is None:
        return None
    if protocol not in MOONCAKE_PROTOCOLS:
        return (f"{subject}={protocol!r} is not a Mooncake transport (the transfer engine would silently fall back "
                f"to TCP); allowed: {_words(MOONCAKE_PROTOCOLS)}")
    if protocol in NPU_PROTOCOLS and on_npu is False:
        allowed = [p for p in MOONCAKE_PROTOCOLS if p not in NPU_PROTOCOLS]
        return (f"{subject}={protocol!r} is Mooncake's transport between Ascend NPUs and this host has none; "
                f"allowed here: {_words(allowed)}")
    return None


def _words(values: Any) -> str:
    return ", ".join(repr(v) for v in values)


def _known_connectors() -> list[str]:
    from ascend_kernel.upstream import kv_connector_names

    return kv_connector_names()


def _config_fields() -> list[str]:
    from vllm.config import KVTransferConfig

    return [f.name for f in dataclasses.fields(KVTransferConfig) if f.init]


def _roles() -> tuple[str, ...]:
    from vllm.config.kv_transfer import KVRole

    return get_args(KVRole)  # nested Literals flatten: the roles themselves


def problems_in(config: Mapping[str, Any]) -> list[str]:
    """Every problem of a decoded ``kv_transfer_config`` object, in words (empty: vLLM may take it)."""
    problems = []
    fields = _config_fields()
    unknown = [key for key in config if key not in fields]
    if unknown:
        problems.append(f"unknown key{'s' if len(unknown) > 1 else ''} {_words(unknown)}; allowed keys: "
                        f"{', '.join(fields)}")
    connector, role = config.get("kv_connector"), config.get("kv_role")
    roles = _roles()
    if role is not None and role not in roles:
        problems.append(f"kv_role={role!r} is not a role; allowed: {_words(roles)}")
    elif role is None and connector is not None:
        problems.append(f"kv_role is missing (a connector needs one); allowed: {_words(roles)}")
    if connector is not None and not config.get("kv_connector_module_path"):
        known = _known_connectors()
        if not isinstance(connector, str) or connector not in known:
            problems.append(f"kv_connector={connector!r} is not a connector vLLM knows; allowed: {', '.join(known)} "
                            "(or your own class with kv_connector_module_path)")
    extra = config.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        problems.append(f"kv_connector_extra_config={extra!r} is not a JSON object")
    elif connector == MOONCAKE:
        protocol_problem = mooncake_protocol_problem(extra)
        if protocol_problem is not None:
            problems.append(protocol_problem)
    return problems


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def check_kv_transfer_config(text: str, flag: str = "--kv-transfer-config") -> dict[str, Any]:
    """The flag's JSON object, or :class:`KVTransferConfigError` saying everything that is wrong with it."""
    example = '\'{"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}\''
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KVTransferConfigError(f"{flag} {text!r} is not valid JSON ({exc.msg} at character {exc.pos}); "
                                    f"allowed: a JSON object such as {example}") from None
    if not isinstance(config, dict):
        kind = _JSON_KINDS.get(type(config), type(config).__name__)
        raise KVTransferConfigError(f"{flag} {text!r} is a JSON {kind}, not an object; allowed: a JSON object such "
                                    f"as {example}")
    problems = problems_in(config)
    if problems:
        raise KVTransferConfigError(f"{flag} {text!r} is not allowed: {'; '.join(problems)}.")
    return config


def check_mooncake_protocol(text: str, flag: str = "--mooncake-protocol") -> str:
    """``serve-pd --mooncake-protocol``: the transport name, or a :class:`KVTransferConfigError` saying what is allowed."""
    problem = mooncake_protocol_problem({"mooncake_protocol": text}, flag)
    if problem is not None:
        raise KVTransferConfigError(problem)
    return text

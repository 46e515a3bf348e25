"""Engine arguments checked against vLLM's own annotations before an engine starts.

``--engine-arg KEY=VALUE`` (and ``--dtype``, ``--additional-config``,
``--speculative-config``) end up as ``vllm.LLM(**kwargs)``. A value of the
wrong type used to surface as a TypeError, or a pydantic error about some
config class, from deep inside vLLM. Here each keyword is looked up among
``LLM``'s keywords and ``EngineArgs``' fields and its value checked against
their annotations: whole numbers, numbers, booleans, strings, literal choices,
enums, lists, JSON objects (for vLLM's config classes, their keys as well).
Numbers are also held to the bounds of the vLLM config field the keyword
fills (``max_num_seqs`` >= 1, ``gpu_memory_utilization`` in (0, 1]), which
vLLM's config classes declare and would otherwise enforce only while the
engine is being built. A construct the checker does not know passes through
for vLLM to judge.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import inspect
import json
import os
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Union, get_args, get_origin

from ascend_kernel.errors import UsageError

_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set,
              collections.abc.MutableSequence, collections.abc.MutableSet)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_TRUE_FALSE = {"true": True, "false": False}


@dataclass(frozen=True)
class Given:
    """One engine keyword as the user gave it."""

    shown: str  #: how the error shows it: ``--engine-arg max_num_seqs='abc'``, ``--dtype 'f99'``
    value: Any  #: decoded: JSON when the text parses as JSON, else the text
    text: str | None = None  #: the text as typed (string-typed keywords take it verbatim)


def decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def split_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key with ``-`` as ``_``, value text); ValueError naming the format otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} must look like KEY=VALUE (the VALUE is read as JSON when it parses as JSON)")
    return key.strip().replace("-", "_"), value


@dataclass(frozen=True)
class Bounds:
    """Numeric bounds of the vLLM config field a keyword fills (``Annotated`` metadata of its type)."""

    field: str  #: ``SchedulerConfig.max_num_seqs``
    limits: tuple[tuple[str, Any], ...]  #: ``((">=", 1),)``

    def allows(self, value: Any) -> bool:
        checks = {">": value.__gt__, ">=": value.__ge__, "<": value.__lt__, "<=": value.__le__}
        return all(checks[op](limit) is True for op, limit in self.limits)

    def __str__(self) -> str:
        return " and ".join(f"{op} {limit}" for op, limit in self.limits)


@dataclass(frozen=True)
class ConfigKeys:
    """A JSON object vLLM turns into ``config_class`` itself (``Annotated`` metadata): its keys are that class's."""

    config_class: type


def _config_bounds() -> dict[str, Bounds]:
    """Field name -> bounds, from the pydantic fields of vLLM's config classes.

    A name whose config classes declare different bounds (``max_model_len``:
    ModelConfig's >= -1, SpeculativeConfig's >= 1) is left out: which class
    an engine keyword fills is not known here.
    """
    import annotated_types
    import vllm.config

    ops = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="),
           (annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))
    seen: dict[str, set[Bounds]] = {}
    for name in dir(vllm.config):
        cls = getattr(vllm.config, name)
        fields = getattr(cls, "__pydantic_fields__", None) if isinstance(cls, type) else None
        if not isinstance(fields, dict):
            continue
        for field_name, info in fields.items():
            limits = tuple((op, getattr(m, attr)) for m in info.metadata for kind, attr, op in ops
                           if isinstance(m, kind))
            if limits:
                seen.setdefault(field_name, set()).add(Bounds(f"{cls.__name__}.{field_name}", limits))
    return {name: next(iter(found)) for name, found in seen.items()
            if len({b.limits for b in found}) == 1}


def keyword_types() -> dict[str, Any]:
    """Every keyword ``vllm.LLM(...)`` accepts -> its annotation (LLM's own where it has one: it converts).

    Keywords that fill a bounded vLLM config field come as ``Annotated[type, Bounds]``, and
    ``speculative_config`` (a dict vLLM makes into its SpeculativeConfig) as ``Annotated[type, ConfigKeys]``.
    """
    from vllm import LLM
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    found = {f.name: f.type for f in dataclasses.fields(EngineArgs) if f.init and not f.name.startswith("_")}
    for name, param in inspect.signature(LLM.__init__).parameters.items():
        if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            found[name] = param.annotation
    bounds = _config_bounds()
    found = {name: Annotated[tp, bounds[name]] if name in bounds else tp for name, tp in found.items()}
    # a plain dict for LLM and EngineArgs, made into SpeculativeConfig(**dict) while the engine is built
    speculative = found["speculative_config"]
    found["speculative_config"] = Annotated[speculative, ConfigKeys(SpeculativeConfig)]
    # vLLM's annotation lists its built-in methods; platforms register more (the kernel's plugins: ascend)
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    found["quantization"] = Literal[tuple(QUANTIZATION_METHODS)] | None  # type: ignore[valid-type]
    return found


class _Mismatch(Exception):
    """The value does not fit the annotation; ``detail`` replaces the generic 'takes ...' when given."""

    def __init__(self, detail: str | None = None):
        super().__init__(detail)
        self.detail = detail


def _unknown_annotation(tp: Any) -> bool:
    return tp is Any or tp is inspect.Parameter.empty or isinstance(tp, (str, typing.TypeVar, typing.ForwardRef))


def _config_fields(tp: Any) -> list[str] | None:
    """Init field names of a vLLM config class (dataclass or pydantic model), or None when tp is none."""
    if not isinstance(tp, type):
        return None
    if dataclasses.is_dataclass(tp):
        return [f.name for f in dataclasses.fields(tp) if f.init]
    model_fields = getattr(tp, "model_fields", None)
    if isinstance(model_fields, dict):
        return list(model_fields)
    return None


def _closest(name: str, names: list[str]) -> str | None:
    match = difflib.get_close_matches(name, names, n=1)
    return match[0] if match else None


def _check_keys(value: dict[str, Any], config_class: type) -> None:
    """:class:`_Mismatch` naming the keys of ``value`` that are no field of ``config_class``."""
    fields = _config_fields(config_class) or []
    unknown = [k for k in value if k not in fields and str(k).replace("-", "_") not in fields]
    if unknown:
        hints = [f"{k!r}" + (f" (did you mean {_closest(k, fields)!r}?)" if _closest(k, fields) else "")
                 for k in unknown]
        raise _Mismatch(f"vLLM's {config_class.__name__} has no field {', '.join(hints)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def convert(value: Any, text: str | None, tp: Any) -> Any:
    """``value`` as ``tp`` asks for it, or :class:`_Mismatch`."""
    if _unknown_annotation(tp):
        return value
    if tp is None or tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        converted = convert(value, text, args[0])
        for extra in args[1:]:
            if isinstance(extra, Bounds) and _is_number(converted) and not extra.allows(converted):
                raise _Mismatch(f"vLLM's {extra.field} must be {extra}")
            if isinstance(extra, ConfigKeys) and isinstance(converted, dict):
                _check_keys(converted, extra.config_class)
        return converted
    if origin in (Union, types.UnionType):
        # a config class sees a JSON object before a plain dict does (it checks the keys); a string
        # member takes the text verbatim, so it comes last
        ordered = sorted(args, key=lambda a: (_config_fields(a) is None, a is str))
        for member in ordered:
            try:
                return convert(value, text, member)
            except _Mismatch as exc:
                if exc.detail:
                    raise
        raise _Mismatch
    if origin is Literal:
        for choice in args:
            if type(choice) is type(value) and choice == value:
                return choice
        for choice in args:
            if text is not None and str(choice) == text:
                return choice
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE_FALSE:
            return _TRUE_FALSE[value.lower()]
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if _is_number(value):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        if text is not None and not isinstance(value, (dict, list)):
            return text  # e.g. revision=1234: JSON read a number, the keyword wants the text
        raise _Mismatch
    if origin in _SEQUENCES or tp in _SEQUENCES:
        if not isinstance(value, list):
            raise _Mismatch
        item = args[0] if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)) else Any
        items = [convert(v, v if isinstance(v, str) else None, item) for v in value]
        return set(items) if origin in (set, frozenset, collections.abc.Set, collections.abc.MutableSet) else \
            tuple(items) if origin is tuple else items
    if origin in _MAPPINGS or tp in _MAPPINGS:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    if origin is type or origin is collections.abc.Callable or tp is collections.abc.Callable:
        raise _Mismatch  # a Python object: nothing a command line can give
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            for member in tp:
                if (isinstance(value, str) and member.name.lower() == value.lower()) \
                        or (type(member.value) is type(value) and member.value == value):
                    return member
            raise _Mismatch
        if _config_fields(tp) is not None:
            if not isinstance(value, dict):
                raise _Mismatch
            _check_keys(value, tp)
            return value
        if issubclass(tp, os.PathLike) and isinstance(value, str):
            return value
        if isinstance(value, tp):
            return value
        raise _Mismatch
    return value  # a construct not known here: vLLM judges


def describe(tp: Any) -> str:
    """An annotation in words, for the error message."""
    if _unknown_annotation(tp):
        return "any value"
    if tp is None or tp is type(None):
        return "null"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        bounds = [b for b in args[1:] if isinstance(b, Bounds)]
        return describe(args[0]) + "".join(f" ({b.field} must be {b})" for b in bounds)
    if origin in (Union, types.UnionType):
        parts = []
        for member in sorted(args, key=lambda a: a is type(None)):
            text = describe(member)
            if text not in parts:
                parts.append(text)
        return " or ".join(parts)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "a whole number"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin in _SEQUENCES or tp in _SEQUENCES:
        return f"a JSON list (items: {describe(args[0])})" if args else "a JSON list"
    if origin in _MAPPINGS or tp in _MAPPINGS:
        return "a JSON object"
    if origin is type or origin is collections.abc.Callable or tp is collections.abc.Callable:
        return "a Python object (not from the command line)"
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return "one of " + ", ".join(m.name for m in tp)
        if _config_fields(tp) is not None:
            return f"a JSON object of {tp.__name__} fields"
        if issubclass(tp, os.PathLike):
            return "a path"
        return tp.__name__
    return str(tp)


def check(given: Mapping[str, Given], types_by_keyword: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``vllm.LLM``, each converted to what its annotation asks for.

    Every problem (unknown keyword, wrong type) is reported in one :class:`UsageError`.
    """
    out: dict[str, Any] = {}
    problems = []
    for key, item in given.items():
        if key not in types_by_keyword:
            guess = _closest(key, list(types_by_keyword))
            hint = f" (did you mean {guess}?)" if guess else ""
            problems.append(f"{item.shown} is not allowed: vLLM has no engine argument {key!r}{hint}; the keywords "
                            "of vllm.LLM and the fields of vllm.engine.arg_utils.EngineArgs are allowed")
            continue
        tp = types_by_keyword[key]
        try:
            out[key] = convert(item.value, item.text, tp)
        except _Mismatch as exc:
            reason = exc.detail or f"vLLM's {key} takes {describe(tp)}"
            problems.append(f"{item.shown} is not allowed: {reason}")
    if problems:
        raise UsageError("; ".join(problems))
    return out

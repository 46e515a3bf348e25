"""Typed settings: the only place that reads ``ASCEND_KERNEL_*`` variables.

Precedence is ``additional_config["ascend_kernel"]`` (per engine) > environment
(per process) > default. A bad value stops start-up with a :class:`SettingsError`
that names the variable (or additional_config key), the value and what is
allowed. So does an ``ASCEND_KERNEL_*`` variable that is no setting (a typo is
never silently ignored; the error suggests the closest name) and a setting
that is set but empty: empty is an error for every setting except the name
lists (``plugins``, ``disable_plugins``), where it means an empty list.
Nothing else in the project calls ``os.getenv``: it asks for a
:class:`KernelSettings`.

The core declares only kernel-wide settings here; each plugin declares its own
model through the hook ``ascend_kernel_settings``, and :func:`load_settings`
returns one object of the core's and every installed plugin's settings
(:func:`compose_settings`), read as attributes, checked with the same errors.
"""

from __future__ import annotations

import difflib
import os
from types import UnionType
from typing import Any, ClassVar, Collection, Literal, Mapping, Sequence, Union, get_args, get_origin

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing_extensions import Annotated

from ascend_kernel.entry_points import declared_settings, normalise_name
from ascend_kernel.errors import SettingsError

ENV_PREFIX = "ASCEND_KERNEL_"
ADDITIONAL_CONFIG_KEY = "ascend_kernel"
AUTO = "auto"
#: the command that lists every setting (named by the errors)
SETTINGS_COMMAND = "ascend-kernel settings"
#: settings that are lists of names: an empty value means an empty list (every other setting refuses one)
LIST_SETTINGS = ("plugins", "disable_plugins")

NameList = Annotated[tuple[str, ...] | None, NoDecode]
SizeList = Annotated[list[int] | None, NoDecode]
Declared = Sequence[tuple[str, type[BaseModel]]]


def _split_names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = [str(v).strip() for v in value]
    else:
        raise ValueError("must be a comma-separated string or a list of plugin names")
    return tuple(normalise_name(v) for v in items if v)


def parse_capture_sizes(value: Any) -> list[int] | None:
    """Capture sizes from ``"1,2,4"`` or a list: positive whole numbers, sorted, without repeats."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError("must be a non-empty comma-separated list of positive whole numbers")
    sizes = []
    for item in items:
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.isdigit())):
            raise ValueError(f"{item!r} is not a positive whole number")
        if int(item) < 1:
            raise ValueError(f"{item!r} is not a positive whole number")
        sizes.append(int(item))
    return sorted(set(sizes))


#: ``json_schema_extra`` key of a toggle that no plugin implements (see :func:`unimplemented_toggle`)
UNIMPLEMENTED = "unimplemented"


def unimplemented_toggle(feature: str, description: str) -> Any:
    """A boolean toggle of a feature that no plugin implements: false is accepted, true is refused at start-up.

    The Ascend runner's ``VLLM_ASCEND_*`` toggles keep their typed names here so
    that setting one is a clear error (:func:`load_settings`: the variable, the
    value, the feature, ``allowed: false``), never a setting accepted and
    ignored. A plugin model may declare its own the same way. A plugin that
    implements the feature replaces the declaration with an ordinary field and
    reads it.
    """
    return Field(False, description=f"{description} Implemented by no plugin: true is refused at start-up.",
                 json_schema_extra={UNIMPLEMENTED: feature})


def unimplemented_toggles(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> feature, for each toggle of ``model`` declared with :func:`unimplemented_toggle`."""
    return {name: str(info.json_schema_extra[UNIMPLEMENTED]) for name, info in model.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and UNIMPLEMENTED in info.json_schema_extra}


class KernelSettings(BaseSettings):
    """The core's settings, typed: kernel-wide knobs only. ``ascend-kernel settings`` lists them all.

    :func:`load_settings` returns an instance of a subclass that adds the
    settings model of every installed plugin (:func:`compose_settings`), so a
    plugin's setting is read as an attribute (``settings.mc2_min_world_size``)
    and the object is also an instance of each plugin's model.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True)
    #: field name -> the plugin that declared it (core fields are absent)
    owners: ClassVar[Mapping[str, str]] = {}
    #: the (plugin name, settings model) pairs this class was composed from
    declared: ClassVar[tuple[tuple[str, type[BaseModel]], ...]] = ()
    #: the fields given in the kernel's additional_config section (set by :func:`load_settings`; the others came
    #: from the environment or their default)
    _in_config: frozenset[str] = PrivateAttr(default=frozenset())

    # -- where to run -------------------------------------------------------
    device: Literal["auto", "npu", "cpu"] = Field(
        AUTO,
        description="Device: npu (needs torch_npu and a visible NPU), cpu (vLLM's CPU "
        "platform with the kernel), auto (npu when present, else the kernel stays off).",
    )
    ops_provider: Literal["auto", "torch_npu", "reference"] = Field(
        AUTO, description="Kernel provider for the ops seam: torch_npu on NPU, reference (pure torch) elsewhere."
    )
    soc: Literal["auto", "A2", "A3", "310P"] = Field(
        AUTO, description="Ascend SoC generation; auto asks the device. Forcing it lets explain show NPU policies on a CPU host."
    )

    # -- plugin selection ---------------------------------------------------
    plugins: NameList = Field(
        None, description="Allowlist of plugin names (comma separated); unset means all installed plugins."
    )
    disable_plugins: NameList = Field((), description="Denylist of plugin names (comma separated).")
    trace_plugins: bool = Field(False, description="Log every pluggy hook call (start-up only; the decode loop makes none).")

    # -- family-forcing names (auto = highest-priority supported implementation)
    attention_backend: str = Field(AUTO, description="Force the attention backend by name.")
    attention_state: str = Field(AUTO, description="Force the per-step attention-state policy by name.")
    attention_mask: str = Field(AUTO, description="Force the attention mask builder by name.")
    kv_cache_layout: str = Field(AUTO, description="Force the KV-cache layout by name (for the specs it handles).")
    moe_comm: str = Field(AUTO, description="Force the MoE communication policy by name.")
    moe_comm_method: str = Field(
        AUTO, description="Force one MoE communication method (allgather, alltoall, mc2, naive_multicast, or a "
        "third party's) for every batch, whatever the policy says; a batch over its capacity still takes its fallback.",
    )
    drafter: str = Field(AUTO, description="Force the speculative-decoding drafter by name.")
    sampler: str = Field(AUTO, description="Force the sampler by name.")
    rejection_sampler: str = Field(AUTO, description="Force the rejection sampler by name.")
    graph_mode: str = Field(AUTO, description="Force the graph-capture mode by name.")
    layer_ops: str = Field(AUTO, description="Force the model-layer ops (RMSNorm, rotary) provider by name.")
    quantization: str = Field(AUTO, description="Force the quantized-checkpoint implementation by name.")

    # -- read by no plugin: the CLI's serving commands
    engine_liveness_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Serving with engines on other hosts (--headless): a node whose heartbeat (UDP, 1 s, not held "
        "up by engine steps) is silent this many seconds is taken as dead, and the server fails its requests.",
    )
    # -- the Ascend runner's toggles of NPU features no plugin implements: named, so that setting one is refused
    enable_dbo: bool = unimplemented_toggle(
        "dual-batch overlap", "Dual-batch overlap (MLA models): two micro-batches on two NPU streams, one's "
        "communication over the other's compute."
    )
    enable_prefetch_mlp: bool = unimplemented_toggle(
        "MLP weight prefetch", "Prefetch MLP weights into the NPU's L2 cache on a side stream."
    )
    # -- the server's report route (the CLI reads it)
    report_rpc_timeout_s: float = Field(
        60.0, gt=0,
        description="The server's GET /ascend-kernel/report: seconds the engine's workers may take to answer.",
    )

    @field_validator("plugins", mode="before")
    @classmethod
    def _allow_names(cls, value: Any) -> tuple[str, ...] | None:
        return _split_names(value)

    @field_validator("disable_plugins", mode="before")
    @classmethod
    def _deny_names(cls, value: Any) -> tuple[str, ...]:
        return _split_names(value) or ()

    @field_validator(
        "attention_backend", "attention_state", "attention_mask", "kv_cache_layout",
        "moe_comm", "moe_comm_method", "drafter", "sampler", "rejection_sampler", "graph_mode", "layer_ops",
        "quantization",
    )
    @classmethod
    def _forced_name(cls, value: str) -> str:
        if not value or not value.strip():
            raise ValueError("must be a non-empty implementation name or 'auto'")
        return normalise_name(value)

    def forced(self, field: str) -> str | None:
        """The name a family-forcing setting asks for, or None for ``auto``."""
        value = getattr(self, field)
        return None if value == AUTO else value

    @staticmethod
    def env_name(field: str) -> str:
        return ENV_PREFIX + field.upper()

    def source_name(self, field: str) -> str:
        """What the user wrote to set ``field``, for messages: the additional_config key, else the variable."""
        return _source_of(field, self._in_config)

    def __reduce__(self) -> tuple[Any, ...]:
        # a composed class is made at run time: unpickling (a worker process) composes it again
        return _restore, (self.declared, self.__getstate__())


def _restore(declared: Declared, state: dict[str, Any]) -> KernelSettings:
    cls = compose_settings(declared)
    settings = cls.__new__(cls)
    settings.__setstate__(state)
    return settings


_composed: dict[tuple[tuple[str, type[BaseModel]], ...], type[KernelSettings]] = {}


def compose_settings(declared: Declared) -> type[KernelSettings]:
    """The core's settings class plus each plugin's model: one class, the same one for the same models.

    ``declared`` is [(plugin name, pydantic model class)]. A field name that
    the core or another plugin already has is a :class:`SettingsError` naming
    both owners; so is a declaration that is no pydantic model class.
    """
    key = tuple((plugin, model) for plugin, model in declared)
    if key in _composed:
        return _composed[key]
    owners: dict[str, str] = {}
    for plugin, model in key:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise SettingsError(f"plugin '{plugin}' declares settings {model!r}: ascend_kernel_settings must "
                                "return a pydantic model class (or None)")
        for name in model.model_fields:
            other = "the core" if name in KernelSettings.model_fields else \
                f"plugin '{owners[name]}'" if name in owners else None
            if other is not None:
                raise SettingsError(f"setting '{name}' ({KernelSettings.env_name(name)}) is declared twice: by "
                                    f"{other} and by plugin '{plugin}'; one of them must rename it")
            owners[name] = plugin
    cls = KernelSettings
    if key:
        namespace = {"model_config": KernelSettings.model_config, "owners": owners, "declared": key,
                     "__module__": __name__, "__qualname__": "KernelSettings"}
        cls = type(KernelSettings)("KernelSettings", (KernelSettings, *[m for _, m in key]), namespace)
    _composed[key] = cls
    return cls


def settings_model(declared: Declared | None = None) -> type[KernelSettings]:
    """This installation's settings class: the core's and every installed plugin's, enabled or not.

    The set of settings never depends on ``plugins``/``disable_plugins``
    (settings themselves): a disabled plugin's setting is still checked, and
    has no effect.
    """
    if declared is None:
        declared = declared_settings()
    return compose_settings(declared)


def _env_value(name: str) -> str | None:
    """pydantic-settings matches env names case-insensitively; so must the messages."""
    return next((value for key, value in os.environ.items() if key.upper() == name), None)


def _source_of(field: str, given: Collection[str]) -> str:
    """The additional_config key of ``field`` where it was given there, else its variable."""
    key = f'additional_config["{ADDITIONAL_CONFIG_KEY}"]["{field}"]'
    return key if field in given else KernelSettings.env_name(field)


def _bare(annotation: Any) -> Any:
    """``float | None`` -> ``float`` (an optional setting accepts what its type accepts)."""
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def allowed_values(field: str, model: type[KernelSettings] | None = None) -> str:
    """What a setting accepts, in words, for error messages.

    A field may say it itself: ``Field(..., json_schema_extra={"allowed": "..."})``.
    """
    info = (model or settings_model()).model_fields[field]
    annotation = _bare(info.annotation)
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "allowed" in extra:
        return str(extra["allowed"])
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(annotation))
    if annotation is bool:
        return "true or false, 1 or 0, yes or no, on or off"
    if annotation in (int, float):
        words = "a whole number" if annotation is int else "a number"
        for meta in info.metadata:
            for op, attr in ((">=", "ge"), (">", "gt")):
                if getattr(meta, attr, None) is not None:
                    words += f" {op} {getattr(meta, attr)}"
        return words
    if field in LIST_SETTINGS:
        return "comma-separated plugin names (empty for none)"
    return f"{AUTO!r} or a non-empty implementation name, as listed by `ascend-kernel plugins`"


def _closest(name: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(name.lower(), [c.lower() for c in candidates], n=1)
    return next((c for c in candidates if match and c.lower() == match[0]), None)


def _unknown_env(key: str, value: str, model: type[KernelSettings]) -> str:
    fields = list(model.model_fields)
    guess = _closest(key.upper().removeprefix(ENV_PREFIX), [f.upper() for f in fields])
    hint = f" (did you mean {ENV_PREFIX}{guess}?)" if guess else ""
    return f"{key}={value!r} is not a setting{hint}; `{SETTINGS_COMMAND}` lists every setting"


def _empty(source: str, field: str, model: type[KernelSettings]) -> str:
    default = model.model_fields[field].default
    return f"{source} is set but empty; allowed: {allowed_values(field, model)} (default {default!r})"


def _is_blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


def _early_problems(overrides: Mapping[str, Any], model: type[KernelSettings]) -> tuple[list[str], set[str]]:
    """Unknown ``ASCEND_KERNEL_*`` variables and empty values, which pydantic would ignore or misname.

    Returns the messages and the fields they cover (their pydantic errors are not repeated).
    """
    problems: list[str] = []
    covered: set[str] = set()
    known = {KernelSettings.env_name(f): f for f in model.model_fields}
    for key, value in sorted(os.environ.items()):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        field = known.get(upper)
        if field is None:
            problems.append(_unknown_env(key, value, model))
        elif field not in overrides and field not in LIST_SETTINGS and _is_blank(value):
            problems.append(_empty(key, field, model))
            covered.add(field)
    for field, value in overrides.items():
        if field in model.model_fields and field not in LIST_SETTINGS and _is_blank(value):
            problems.append(_empty(_source_of(field, overrides), field, model))
            covered.add(field)
    return problems, covered


def _describe(error: dict[str, Any], overrides: Mapping[str, Any], model: type[KernelSettings]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    field = loc[0] if loc else "?"
    if error.get("type") == "extra_forbidden":
        known = ", ".join(sorted(model.model_fields))
        guess = _closest(field, list(model.model_fields))
        hint = f" (did you mean {guess!r}?)" if guess else ""
        return (f'unknown setting additional_config["{ADDITIONAL_CONFIG_KEY}"]["{field}"]{hint}; '
                f"known settings: {known}")
    source = _source_of(field, overrides)
    value = overrides.get(field) if field in overrides else _env_value(KernelSettings.env_name(field))
    message = f"{source}={value!r} is not allowed: {error.get('msg', 'invalid value')}"
    if field not in overrides and value is None and field in model.model_fields:  # a plugin's own default
        owner = f"plugin '{model.owners[field]}'" if field in model.owners else "the core"
        message = (f"the default of {field} (declared by {owner}), {model.model_fields[field].default!r}, is not "
                   f"allowed: {error.get('msg', 'invalid value')}")
    info = model.model_fields.get(field)
    if info is not None and (info.annotation in (bool, int) or (
            isinstance(info.json_schema_extra, dict) and "allowed" in info.json_schema_extra)):
        message += f"; allowed: {allowed_values(field, model)}"
    return message


def _refused_toggles(settings: KernelSettings, overrides: Mapping[str, Any], model: type[KernelSettings]) -> list[str]:
    """One message per toggle set to true whose feature no plugin implements."""
    return [f"{_source_of(name, overrides)}={overrides.get(name, _env_value(KernelSettings.env_name(name)))!r} is "
            f"refused: {feature} is implemented by no installed plugin (the setting, declared by "
            f"{'plugin ' + repr(model.owners[name]) if name in model.owners else 'the core'}, names the Ascend "
            "runner's toggle so that it is not silently ignored); allowed: false"
            for name, feature in unimplemented_toggles(model).items() if getattr(settings, name)]


def _foreign(additional_config: Mapping[str, Any], model: type[KernelSettings]) -> dict[str, Any]:
    """Settings that installed plugins read off keys outside the kernel's section (another project's names).

    A plugin's settings model may define ``from_foreign_config(additional_config, model) -> {setting: value}``
    (vllm-ascend's keys, say); it raises :class:`SettingsError` to refuse a key. Run for every installed model.
    """
    return {name: value for _, declared_model in model.declared if hasattr(declared_model, "from_foreign_config")
            for name, value in declared_model.from_foreign_config(additional_config, model).items()}


def load_settings(additional_config: Mapping[str, Any] | None = None, *,
                  declared: Declared | None = None) -> KernelSettings:
    """Build the settings for one engine: additional_config > env > default.

    ``additional_config`` is vLLM's ``VllmConfig.additional_config`` (the whole
    dict); the core reads its ``"ascend_kernel"`` entry, and a plugin model's
    ``from_foreign_config`` the other keys (:func:`_foreign`), below that entry. Every problem (bad
    values, unknown ``ASCEND_KERNEL_*`` variables, empty values) is reported in
    one :class:`SettingsError`. The settings are the core's plus those the
    installed plugins declare (``declared``, for tests: [(plugin, model)]).
    """
    overrides: Mapping[str, Any] = {}
    if additional_config:
        section = additional_config.get(ADDITIONAL_CONFIG_KEY) or {}
        if not isinstance(section, Mapping):
            raise SettingsError(f'additional_config["{ADDITIONAL_CONFIG_KEY}"] must be a mapping of setting '
                                f"names to values, got {type(section).__name__}")
        overrides = dict(section)
    model = settings_model(declared)
    in_config = frozenset(overrides)
    overrides = {**_foreign(additional_config or {}, model), **overrides}
    problems, covered = _early_problems(overrides, model)
    settings = None
    try:
        settings = model(**overrides)
    except ValidationError as exc:
        problems += [_describe(e, overrides, model) for e in exc.errors()
                     if not (e.get("loc") and str(e["loc"][0]) in covered)]
    if settings is not None:
        problems += _refused_toggles(settings, overrides, model)
    if problems or settings is None:
        raise SettingsError(f"Invalid ascend-kernel setting: {'; '.join(problems)}.")
    settings._in_config = in_config
    return settings


def env_requests_kernel() -> bool:
    """True when any ``ASCEND_KERNEL_*`` variable is set (used to fail loudly, not silently)."""
    return any(key.upper().startswith(ENV_PREFIX) for key in os.environ)

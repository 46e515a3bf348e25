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
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal, Mapping, get_args, get_origin

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing_extensions import Annotated

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


def normalise_name(name: str) -> str:
    """Implementation and plugin names compare case-insensitively, ``_`` == ``-``."""
    return name.strip().lower().replace("_", "-")


class KernelSettings(BaseSettings):
    """Every knob of the kernel, typed. ``ascend-kernel settings`` lists them."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True
    )

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
    disable_plugins: NameList = Field(
        (), description="Denylist of plugin names (comma separated)."
    )
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
    graph_capture_sizes: SizeList = Field(
        None, description="Batch sizes (tokens) a capturing graph mode captures, comma separated; "
        "unset means the mode's default. Larger batches run eagerly.",
    )
    graph_capture_mode: Literal["auto", "piecewise", "full_decode_only"] = Field(
        "auto", description="What a capturing graph mode captures: 'piecewise' (attention runs between captured "
        "pieces; every batch up to the largest size) or 'full_decode_only' (uniform decode batches captured whole, "
        "attention inside; other batches run eagerly). 'auto': the mode's default (cpu-graph: piecewise; aclgraph: "
        "vLLM's cudagraph_mode).",
    )

    # -- feature toggles (typed replacements of the seeds' VLLM_ASCEND_* env vars)
    enable_topk_topp_optimization: bool = Field(
        False, description="Use the Ascend top-k/top-p sampler where a plugin provides it."
    )
    enable_dbo: bool = Field(False, description="Dual-batch overlap (MLA models).")
    enable_prefetch_mlp: bool = Field(False, description="Prefetch MLP weights on a side stream.")
    enable_fused_mc2: bool = Field(False, description="Use the fused MC2 MoE kernel.")
    enable_mc2_hierarchy_comm: bool = Field(
        False, description="Hierarchical MC2 communication (incompatible with fused MC2)."
    )
    mc2_min_world_size: int = Field(
        16, ge=1, description="On A2, MC2 is used only when the DP x TP world has at least this many ranks."
    )
    kv_transfer_alignment_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1,
        description="Alignment of every KV tensor when a KV-transfer (PD) config is present (llmdatadist needs 2 MiB).",
    )
    kv_transfer_pull_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Decode (kv_consumer) instances under Mooncake: the longest one pull of a prompt's KV pages "
        "waits for the producer's answer; then the request fails and its blocks are freed. Unset: vLLM's own bound "
        "(VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s). Must exceed VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT: until then "
        "a live producer may still write the pages into the consumer's blocks.",
    )
    engine_liveness_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Serving with engines on other hosts (--headless): an engine that does not answer a liveness "
        "question within this many seconds is taken as dead, and the server fails its requests.",
    )
    # -- serving timeouts (issue 33): ascend-kernel pd-proxy / serve-pd / the report route ----------------------
    pd_proxy_timeout_s: float = Field(
        600.0, gt=0,
        description="pd-proxy: seconds a prefill or decode instance may take to answer a request (and serve-pd's "
        "proxy the same); pd-proxy --timeout overrides it.",
    )
    pd_proxy_connect_timeout_s: float = Field(
        10.0, gt=0, description="pd-proxy: seconds to open a connection to an instance.",
    )
    pd_proxy_health_interval_s: float = Field(
        5.0, gt=0,
        description="pd-proxy: seconds between health checks of each instance (GET /health); an instance that "
        "fails one leaves the rotation until a later check answers 200.",
    )
    pd_proxy_health_timeout_s: float = Field(
        5.0, gt=0, description="pd-proxy: seconds one instance health check may take before it counts as failed.",
    )
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

    @field_validator("graph_capture_sizes", mode="before")
    @classmethod
    def _sizes(cls, value: Any) -> list[int] | None:
        return parse_capture_sizes(value)

    @field_validator(
        "attention_backend", "attention_state", "attention_mask", "kv_cache_layout",
        "moe_comm", "moe_comm_method", "drafter", "sampler", "rejection_sampler", "graph_mode", "layer_ops",
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


def _env_value(name: str) -> str | None:
    """pydantic-settings matches env names case-insensitively; so must the messages."""
    for key, value in os.environ.items():
        if key.upper() == name:
            return value
    return None


def _source_of(field: str, overrides: Mapping[str, Any]) -> str:
    if field in overrides:
        return f'additional_config["{ADDITIONAL_CONFIG_KEY}"]["{field}"]'
    return KernelSettings.env_name(field)


def allowed_values(field: str) -> str:
    """What a setting accepts, in words, for error messages."""
    info = KernelSettings.model_fields[field]
    annotation = info.annotation
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(annotation))
    if annotation is bool:
        return "true or false, 1 or 0, yes or no, on or off"
    if annotation is int:
        bound = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
        return "a whole number" + (f" >= {bound}" if bound is not None else "")
    if field in LIST_SETTINGS:
        return "comma-separated plugin names (empty for none)"
    if field == "graph_capture_sizes":
        return "comma-separated positive whole numbers (e.g. 1,2,4)"
    return f"{AUTO!r} or a non-empty implementation name, as listed by `ascend-kernel plugins`"


def _closest(name: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(name.lower(), [c.lower() for c in candidates], n=1)
    return next((c for c in candidates if match and c.lower() == match[0]), None)


def _unknown_env(key: str, value: str) -> str:
    fields = list(KernelSettings.model_fields)
    guess = _closest(key.upper().removeprefix(ENV_PREFIX), [f.upper() for f in fields])
    hint = f" (did you mean {ENV_PREFIX}{guess}?)" if guess else ""
    return f"{key}={value!r} is not a setting{hint}; `{SETTINGS_COMMAND}` lists every setting"


def _empty(source: str, field: str) -> str:
    default = KernelSettings.model_fields[field].default
    return f"{source} is set but empty; allowed: {allowed_values(field)} (default {default!r})"


def _is_blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


def _early_problems(overrides: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """Unknown ``ASCEND_KERNEL_*`` variables and empty values, which pydantic would ignore or misname.

    Returns the messages and the fields they cover (their pydantic errors are not repeated).
    """
    problems: list[str] = []
    covered: set[str] = set()
    known = {KernelSettings.env_name(f): f for f in KernelSettings.model_fields}
    for key, value in sorted(os.environ.items()):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        field = known.get(upper)
        if field is None:
            problems.append(_unknown_env(key, value))
        elif field not in overrides and field not in LIST_SETTINGS and _is_blank(value):
            problems.append(_empty(key, field))
            covered.add(field)
    for field, value in overrides.items():
        if field in KernelSettings.model_fields and field not in LIST_SETTINGS and _is_blank(value):
            problems.append(_empty(_source_of(field, overrides), field))
            covered.add(field)
    return problems, covered


def _describe(error: dict[str, Any], overrides: Mapping[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    field = loc[0] if loc else "?"
    if error.get("type") == "extra_forbidden":
        known = ", ".join(sorted(KernelSettings.model_fields))
        guess = _closest(field, list(KernelSettings.model_fields))
        hint = f" (did you mean {guess!r}?)" if guess else ""
        return (
            f'unknown setting additional_config["{ADDITIONAL_CONFIG_KEY}"]["{field}"]{hint}; '
            f"known settings: {known}"
        )
    source = _source_of(field, overrides)
    value = overrides.get(field) if field in overrides else _env_value(KernelSettings.env_name(field))
    message = f"{source}={value!r} is not allowed: {error.get('msg', 'invalid value')}"
    if field == "graph_capture_sizes" or (
            field in KernelSettings.model_fields and KernelSettings.model_fields[field].annotation in (bool, int)):
        message += f"; allowed: {allowed_values(field)}"
    return message


def load_settings(additional_config: Mapping[str, Any] | None = None) -> KernelSettings:
    """Build the settings for one engine: additional_config > env > default.

    ``additional_config`` is vLLM's ``VllmConfig.additional_config`` (the whole
    dict); only its ``"ascend_kernel"`` entry is read. Every problem (bad
    values, unknown ``ASCEND_KERNEL_*`` variables, empty values) is reported in
    one :class:`SettingsError`.
    """
    overrides: Mapping[str, Any] = {}
    if additional_config:
        section = additional_config.get(ADDITIONAL_CONFIG_KEY) or {}
        if not isinstance(section, Mapping):
            raise SettingsError(
                f'additional_config["{ADDITIONAL_CONFIG_KEY}"] must be a mapping of setting '
                f"names to values, got {type(section).__name__}"
            )
        overrides = dict(section)
    problems, covered = _early_problems(overrides)
    settings = None
    try:
        settings = KernelSettings(**overrides)
    except ValidationError as exc:
        problems += [_describe(e, overrides) for e in exc.errors()
                     if not (e.get("loc") and str(e["loc"][0]) in covered)]
    if problems or settings is None:
        raise SettingsError(f"Invalid ascend-kernel setting: {'; '.join(problems)}.")
    return settings


def env_requests_kernel() -> bool:
    """True when any ``ASCEND_KERNEL_*`` variable is set (used to fail loudly, not silently)."""
    return any(key.upper().startswith(ENV_PREFIX) for key in os.environ)


def describe_settings(settings: KernelSettings | None = None) -> list[dict[str, Any]]:
    """One row per setting: name, type, default, env var, current value."""
    rows = []
    for name, field in KernelSettings.model_fields.items():
        annotation = field.annotation
        type_name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        rows.append(
            {
                "name": name,
                "type": type_name,
                "default": field.default,
                "env": KernelSettings.env_name(name),
                "value": getattr(settings, name) if settings is not None else None,
                "description": field.description or "",
            }
        )
    return rows

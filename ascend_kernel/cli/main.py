"""``ascend-kernel``: inspect plugins and settings, explain decisions, make tiny models, generate.

Every subcommand takes ``--json``. Errors the kernel raises on purpose
(a bad setting, a plugin that fails, an unknown implementation name) and bad
command-line values (checked before any engine starts: numbers, JSON flags,
``--engine-arg`` values against vLLM's own types) are printed as one paragraph
with exit status 2, not as a traceback.

This module holds the command table and the error handling; each command
lives in a module of its own (:mod:`~ascend_kernel.cli.info_commands`,
:mod:`~ascend_kernel.cli.explain`, :mod:`~ascend_kernel.cli.generate`;
``serve``, ``pd-proxy`` and ``serve-pd`` take their own parsers).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ascend_kernel.cli import explain, generate, info_commands
from ascend_kernel.cli.arg_types import ArgumentParser
from ascend_kernel.cli.engine_request import add_engine_args
from ascend_kernel.cli.output import JsonStdout, paragraphs
from ascend_kernel.errors import KernelError

__all__ = ["JsonStdout", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ascend-kernel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        return p

    add("plugins", info_commands.cmd_plugins, "registered plugins, their hooks, implementations and entry points")
    info_commands.add_settings_arguments(add(
        "settings", info_commands.cmd_settings, "every setting (the core's and each plugin's): type, default, env var, "
        "current value, owning plugin"))
    info_commands.add_tiny_model_arguments(add("tiny-model", info_commands.cmd_tiny_model,
                                               "write a small random-weight local model"))
    info_commands.add_real_model_arguments(add("real-model", info_commands.cmd_real_model,
                                               info_commands.real_model_help()))
    add_engine_args(add("explain", explain.cmd_explain,
                        "decision records for a model and config (builds the engine, no generation)"))
    generate.add_arguments(add("generate", generate.cmd_generate,
                               "greedy offline generation through vLLM with the kernel"))
    p = add("conformance", info_commands.cmd_conformance,
            "check every implementation a plugin registers against its family's contract (no engine starts)")
    from ascend_kernel.conformance.cli import add_arguments as add_conformance_arguments

    add_conformance_arguments(p)
    # listed for --help only: main() hands `serve` and everything after it to vLLM's own serve parser
    sub.add_parser("serve", add_help=False, help="vLLM's OpenAI-compatible server with the kernel: "
                   "ascend-kernel serve MODEL [any vLLM serve argument] (see: ascend-kernel serve --help)")
    sub.add_parser("pd-proxy", add_help=False, help="prefill/decode proxy: ascend-kernel pd-proxy --port P "
                   "--prefill URL --decode URL (see: ascend-kernel pd-proxy --help)")
    sub.add_parser("serve-pd", add_help=False, help="prefill and decode instances plus the proxy on this host: "
                   "ascend-kernel serve-pd MODEL --prefill N --decode N (see: ascend-kernel serve-pd --help)")
    return parser


def main(argv: Sequence[str] | None = None, keep_stdout: bool | None = None) -> int:
    """The command line (``argv`` None: ``sys.argv``). With ``--json``, fd 1 stays pointed at stderr after the
    command when run from the command line (``keep_stdout``, default: ``argv`` is None), so nothing that
    outlives the command writes after the document; in-process callers get their stdout back."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from ascend_kernel.cli.serve import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["pd-proxy"]:
        from ascend_kernel.cli.pd_proxy import main as proxy_main

        return proxy_main(argv[1:])
    if argv[:1] == ["serve-pd"]:
        from ascend_kernel.cli.serve_pd import main as serve_pd_main

        return serve_pd_main(argv[1:])
    args = build_parser().parse_args(argv)
    keep_redirected = keep_stdout if keep_stdout is not None else from_command_line
    if getattr(args, "json", False):
        args.json_stdout = JsonStdout(keep=keep_redirected).claim()
    try:
        return args.func(args)
    except (KernelError, ValueError) as exc:
        cause = exc
        while not isinstance(cause, KernelError) and cause.__cause__ is not None:
            cause = cause.__cause__
        print(f"ascend-kernel: error: {_one_paragraph(cause if isinstance(cause, KernelError) else exc)}",
              file=sys.stderr)
        return 2
    finally:
        if getattr(args, "json_stdout", None) is not None and not keep_redirected:
            args.json_stdout.release()


def _one_paragraph(exc: BaseException) -> str:
    """The message a line per paragraph; vLLM's pydantic config errors as 'Config: field: problem (given ...)'."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for e in exc.errors():
            where = ".".join(str(part) for part in e.get("loc", ()))
            value = e.get("input")
            given = f" (given {value!r})" if isinstance(value, (str, int, float, bool)) else ""
            parts.append(f"{where + ': ' if where else ''}{e.get('msg', '')}{given}")
        return f"vLLM refused the {exc.title}: " + "; ".join(parts)
    return paragraphs(str(exc))


if __name__ == "__main__":
    sys.exit(main())

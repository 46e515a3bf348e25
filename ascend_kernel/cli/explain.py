"""``ascend-kernel explain``: build the engine for a model and config, print the kernel's decision records."""

from __future__ import annotations

import argparse

from ascend_kernel.cli.engine_request import engine_request
from ascend_kernel.cli.output import emit, engine_output_to_stderr
from ascend_kernel.cli.render import report_text
from ascend_kernel.errors import KernelError


def cmd_explain(args: argparse.Namespace) -> int:
    from ascend_kernel.cli import engine

    engine.prepare_process(kernel=True)
    with engine_output_to_stderr():
        request = engine_request(args, kernel=True)
        llm = engine.build_llm(request)
        try:
            report = engine.kernel_report(llm)
        finally:
            engine.shutdown(llm)
    if report is None:
        raise KernelError("the engine did not start on the kernel platform (is another platform plugin active?)")
    report.pop("trace", None)
    emit(args, report, report_text(report))
    return 0

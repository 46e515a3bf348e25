"""The kernel inside vLLM's logging: its records through vLLM's handlers, one start-up summary, readable errors.

:func:`wire_into_vllm` runs in every process where the kernel platform is
loaded (front end, engine core, workers). After it:

* records of the ``ascend_kernel`` logger go through vLLM's ``vllm`` logger,
  so they carry vLLM's format, process name, stream and level;
* a log record that carries a :class:`~ascend_kernel.errors.KernelError` (in
  its exception or the exception's causes) is written as one paragraph
  without a traceback: vLLM logs engine start-up failures with
  ``logger.exception`` in the engine-core and worker processes, and a bad
  setting or an unknown implementation name is a sentence for a person, not
  a stack.

:func:`log_startup` writes the engine's summary once (the first worker calls
it after the KV cache is allocated): device, ops provider, start-up time,
every family's decision (chosen, plugin, why, what was passed over), config
changes and the KV-cache layouts.
"""

from __future__ import annotations

import logging
from typing import Any

from ascend_kernel.config_changes import ConfigChange
from ascend_kernel.errors import KernelError

logger = logging.getLogger("ascend_kernel")

VLLM_LOGGER = "vllm"


class _ToVllm(logging.Handler):
    """Hands the kernel's records to vLLM's logger (looked up per record: vLLM may reconfigure its handlers)."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(VLLM_LOGGER)
        if record.levelno >= target.getEffectiveLevel():
            target.handle(record)


class _KernelErrorsAsParagraphs:
    """A log-record factory: a record about a KernelError keeps its message plus the error's sentence, no traceback."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.factory(*args, **kwargs)
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None:
            error = kernel_error_in(exc_info[1])
            if error is not None:
                try:
                    message = record.getMessage()
                except Exception:  # noqa: BLE001 - a malformed message must not hide the error
                    message = str(record.msg)
                record.msg = f"{message} ascend-kernel: {one_paragraph(error)}"
                record.args = None
                record.exc_info = None
                record.exc_text = None
        return record


def kernel_error_in(exc: BaseException) -> KernelError | None:
    """The KernelError that ``exc`` is, or was caused by (explicitly or while handling it), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KernelError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def one_paragraph(exc: BaseException) -> str:
    return " ".join(str(exc).split())


#: the one process-wide change logging needs, kept for the life of the process (records are made until it exits),
#: so recorded like a config change: the platform adds it to every engine's changes (``explain``, the report)
RECORD_FACTORY_CHANGE = ConfigChange(
    "logging.log_record_factory", "the process's factory", "the same, wrapped: a KernelError's record is one paragraph",
    "vLLM logs start-up failures with logger.exception; a kernel error is a sentence for a person, not a stack",
    "logs")


def wire_into_vllm() -> ConfigChange:
    """Route the kernel's logging through vLLM's (idempotent; call where vLLM is imported); the recorded change."""
    kernel_logger = logging.getLogger("ascend_kernel")
    if not any(isinstance(h, _ToVllm) for h in kernel_logger.handlers):
        kernel_logger.addHandler(_ToVllm())
    # records below vLLM's level are not even created (and never reach a root handler either)
    kernel_logger.setLevel(logging.getLogger(VLLM_LOGGER).getEffectiveLevel())
    factory = logging.getLogRecordFactory()
    if not _wraps(factory, _KernelErrorsAsParagraphs):
        logging.setLogRecordFactory(_KernelErrorsAsParagraphs(factory))
    return RECORD_FACTORY_CHANGE


def _wraps(factory: Any, kind: type) -> bool:
    """Whether ``kind`` is in the chain of wrapped record factories (vLLM wraps the factory as well)."""
    from ascend_kernel.upstream import wrapped_record_factory

    seen = 0
    while factory is not None and seen < 16:
        if isinstance(factory, kind):
            return True
        factory = getattr(factory, "factory", None) or wrapped_record_factory(factory)
        seen += 1
    return False


# -- the start-up summary ------------------------------------------------------------


def startup_lines(report: dict[str, Any]) -> list[str]:
    """The summary of one engine's kernel, one line per fact (what :func:`log_startup` writes)."""
    device = report.get("device") or {}
    timings = report.get("startup_ms") or {}
    took = ""
    if timings:
        took = (f", start-up {timings.get('discovery', 0.0):.1f} ms plugin discovery + "
                f"{timings.get('selection', 0.0):.1f} ms selection")
    lines = [f"ascend-kernel is active: device {device.get('kind')}"
             + (f" (SoC {device['soc']})" if device.get("soc") else "")
             + f", ops provider {report.get('ops_provider')}{took}; "
             f"{len(report.get('decisions', []))} decisions, {len(report.get('config_changes', []))} config changes"]
    for d in report.get("decisions", []):
        family = d["family"] + (f"[{d['subject']}]" if d.get("subject") else "")
        passed = [f"{c['name']} ({c['reason']})" for c in d.get("candidates", []) if not c.get("chosen")]
        if d.get("chosen"):
            line = f"ascend-kernel decision {family} -> {d['chosen']} (plugin {d['plugin']}; {d['forced_by']})"
        else:
            line = f"ascend-kernel decision {family} -> none ({d['forced_by']})"
        if passed and d.get("chosen"):
            line += "; passed over: " + ", ".join(passed)
        lines.append(line)
    for c in report.get("config_changes", []):
        lines.append(f"ascend-kernel config change {c['path']}: {c['old']} -> {c['new']} "
                     f"({c['plugin']}: {c['reason']})")
    kv = report.get("kv_cache") or {}
    if kv.get("layouts"):
        lines.append("ascend-kernel KV cache: " + ", ".join(
            f"{u['spec']} -> {u['layout']} ({u['layers']} layers, {u['bytes']} B)" for u in kv["layouts"])
            + f"; allocated {kv.get('allocated_bytes', 0)} B, alignment {kv.get('alignment', 1)} B")
    if report.get("model_patches"):
        lines.append("ascend-kernel model patches: " + ", ".join(map(str, report["model_patches"])))
    return lines


def log_startup(report: dict[str, Any]) -> None:
    wire_into_vllm()
    for line in startup_lines(report):
        logger.info("%s", line)

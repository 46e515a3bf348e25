"""What the conformance kit reports: one :class:`CheckResult` per (implementation, contract)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ascend_kernel.errors import KernelError

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One contract of one implementation: who, what, and how it went."""

    plugin: str
    family: str
    implementation: str
    contract: str
    status: str  # "pass" | "fail" | "skip"
    reason: str
    #: the selection context the implementation was built under (config, device, settings), if any
    context: str = ""
    entry_point: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        where = f" [{self.context}]" if self.context else ""
        return (f"plugin '{self.plugin}' {self.family} '{self.implementation}': contract '{self.contract}' "
                f"{self.status.upper()}: {self.reason}{where}")

    def as_dict(self) -> dict[str, Any]:
        return {"plugin": self.plugin, "family": self.family, "implementation": self.implementation,
                "contract": self.contract, "status": self.status, "reason": self.reason,
                "context": self.context, "entry_point": self.entry_point}


class ConformanceError(AssertionError):
    """Raised by :func:`ascend_kernel.conformance.check_plugin` when a contract is broken (lists every one)."""

    def __init__(self, failures: list[CheckResult]) -> None:
        self.failures = failures
        super().__init__(f"{len(failures)} broken contract(s):\n" + "\n".join("  " + f.line() for f in failures))


@dataclass(slots=True)
class ConformanceReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}

    def of(self, plugin: str | None = None, implementation: str | None = None,
           family: str | None = None) -> list[CheckResult]:
        return [r for r in self.results if (plugin is None or r.plugin == plugin)
                and (implementation is None or r.implementation == implementation)
                and (family is None or r.family == family)]

    def raise_for_failures(self) -> "ConformanceReport":
        if self.failures:
            raise ConformanceError(self.failures)
        return self

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "counts": self.counts(), "results": [r.as_dict() for r in self.results]}


class Skip(Exception):
    """Raised inside a contract check: the contract cannot be exercised here (the message says why)."""


class Checks:
    """Collects the results of one implementation's contracts.

    ``run(contract, fn)`` calls ``fn()``: a returned string is the pass
    reason, :class:`Skip` a skip, any other exception a failure whose reason
    is the exception's message (an ``AssertionError`` from the check itself, or
    whatever the implementation raised, with the frame it came from).
    """

    def __init__(self, plugin: str, family: str, implementation: str, entry_point: str = "") -> None:
        self.plugin, self.family, self.implementation, self.entry_point = plugin, family, implementation, entry_point
        self.context = ""
        self.results: list[CheckResult] = []

    def add(self, contract: str, status: str, reason: str) -> CheckResult:
        result = CheckResult(self.plugin, self.family, self.implementation, contract, status, reason,
                             self.context, self.entry_point)
        self.results.append(result)
        return result

    def passed(self, contract: str, reason: str) -> CheckResult:
        return self.add(contract, PASS, reason)

    def failed(self, contract: str, reason: str) -> CheckResult:
        return self.add(contract, FAIL, reason)

    def skipped(self, contract: str, reason: str) -> CheckResult:
        return self.add(contract, SKIP, reason)

    def run(self, contract: str, fn: Callable[[], str | None]) -> CheckResult:
        try:
            reason = fn()
        except Skip as exc:
            return self.skipped(contract, str(exc))
        except AssertionError as exc:
            return self.failed(contract, str(exc) or "assertion failed")
        except Exception as exc:  # noqa: BLE001 - the implementation's own error is the finding
            return self.failed(contract, describe_exception(exc))
        return self.passed(contract, reason or "ok")


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` for an error an implementation raised."""
    text = " ".join(str(exc).split())
    if isinstance(exc, KernelError):
        return f"{type(exc).__name__}: {text}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {text}{where}"


def all_passed(results: Iterable[CheckResult]) -> bool:
    return all(r.status != FAIL for r in results)

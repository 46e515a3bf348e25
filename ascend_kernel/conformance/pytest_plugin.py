"""pytest plugin of the conformance kit (entry point ``pytest11``: loaded wherever ascend-kernel is installed).

In a plugin package's tests::

    import pytest

    pytestmark = pytest.mark.ascend_kernel_plugin("my-plugin")

    def test_conforms(ascend_kernel_implementation):
        # one test per implementation my-plugin registers, e.g. [my-plugin:sampler:my-sampler]
        ascend_kernel_implementation.assert_conforms()

    def test_whole_plugin(ascend_kernel_conformance):
        ascend_kernel_conformance("my-plugin")  # check_plugin: raises naming every broken contract

The marker takes one or more plugin names and ``distributed=True`` (adds the
two-rank MoE check). An implementation whose contracts could not be exercised
here at all (every one skipped) is reported as a pytest skip with the reasons.
Options: ``--ascend-kernel-cache-dir DIR`` (where the kit's tiny models are
kept). Nothing is imported from vLLM until a test runs.
"""

from __future__ import annotations

from typing import Any

import pytest

MARKER = "ascend_kernel_plugin"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("ascend-kernel", "ascend-kernel conformance kit")
    group.addoption("--ascend-kernel-cache-dir", default=None,
                    help="directory for the conformance kit's tiny models "
                    "(default: ~/.cache/ascend-kernel/conformance)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names, distributed=False): run the ascend-kernel conformance kit over the implementations of "
        "the named plugins (tests taking the 'ascend_kernel_implementation' fixture run once per implementation)",
    )


def pytest_generate_tests(metafunc: Any) -> None:
    if "ascend_kernel_implementation" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None or not marker.args:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: the 'ascend_kernel_implementation' fixture needs "
            f"@pytest.mark.{MARKER}('plugin-name') on the test or its module")
    from ascend_kernel.conformance.runner import implementation_cases

    cases = implementation_cases(list(marker.args))
    if not cases:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: plugin(s) {', '.join(marker.args)} register no "
                                "implementations for the conformance kit to check")
    metafunc.parametrize("_ascend_kernel_case", cases, ids=[case.id for case in cases])


class _CheckedCase:
    """The parametrized implementation, with the marker's options and the session's cache dir bound."""

    def __init__(self, case: Any, distributed: bool, cache_dir: str | None) -> None:
        self.case = case
        self.distributed = distributed
        self.cache_dir = cache_dir

    def __getattr__(self, name: str) -> Any:
        return getattr(self.case, name)

    def check(self) -> list[Any]:
        return self.case.check(distributed=self.distributed, cache_dir=self.cache_dir)

    def assert_conforms(self) -> list[Any]:
        from ascend_kernel.conformance.results import ConformanceReport

        results = self.check()
        ConformanceReport(results).raise_for_failures()
        if results and all(r.status == "skip" for r in results):
            pytest.skip("; ".join(f"{r.contract}: {r.reason}" for r in results))
        return results

    def __repr__(self) -> str:
        return f"<ascend-kernel implementation {self.case.id}>"


@pytest.fixture
def ascend_kernel_implementation(request: Any, _ascend_kernel_case: Any) -> _CheckedCase:
    marker = request.node.get_closest_marker(MARKER)
    distributed = bool(marker.kwargs.get("distributed", False)) if marker is not None else False
    return _CheckedCase(_ascend_kernel_case, distributed, request.config.getoption("--ascend-kernel-cache-dir"))


@pytest.fixture
def ascend_kernel_conformance(request: Any) -> Any:
    """:func:`ascend_kernel.conformance.check_plugin`, using the session's ``--ascend-kernel-cache-dir``."""
    from ascend_kernel.conformance import check_plugin

    cache_dir = request.config.getoption("--ascend-kernel-cache-dir")

    def check(*plugins: str, **kwargs: Any) -> Any:
        kwargs.setdefault("cache_dir", cache_dir)
        return check_plugin(*plugins, **kwargs)

    return check

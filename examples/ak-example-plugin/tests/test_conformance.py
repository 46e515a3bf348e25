"""The ascend-kernel conformance kit over this plugin, through the kit's pytest plugin (entry point pytest11)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ascend_kernel_plugin("example")


def test_each_implementation_conforms(ascend_kernel_implementation):
    # parametrized by the kit: one test per implementation, here [example:attention_state:coarse]
    results = ascend_kernel_implementation.assert_conforms()
    assert {r.contract for r in results if r.status == "pass"} >= {"interface", "state-for-every-batch",
                                                                    "prefill-flag"}


def test_the_whole_plugin(ascend_kernel_conformance):
    report = ascend_kernel_conformance("example")  # raises, naming each broken contract, if one is broken
    assert [(r.family, r.implementation) for r in report.results if r.contract == "builds"] == [
        ("attention_state", "coarse")]

"""The documented rule, row by row (README.md, "The rule")."""

from __future__ import annotations

import numpy as np
import pytest
from ak_example_plugin.policy import CoarseState, CoarseStatePolicy

from ascend_kernel.step import StepBatch


def batch(seq_lens, scheduled, valid=None):
    valid = scheduled if valid is None else valid
    return StepBatch(len(seq_lens), np.array(seq_lens), np.array(scheduled), np.array(valid), sum(scheduled))


@pytest.mark.parametrize(("seq_lens", "scheduled", "valid", "state"), [
    ([4, 6], [4, 6], None, CoarseState.Prefill),  # fresh prompts
    ([1], [1], None, CoarseState.Prefill),  # a one-token prompt is still a prompt
    ([9, 12], [1, 1], None, CoarseState.Decode),
    ([9, 12], [3, 3], [1, 1], CoarseState.Verify),  # two drafts each, verified
    ([20, 9], [8, 1], None, CoarseState.Prefill),  # a prompt chunk beside a decode
    ([20], [8], None, CoarseState.Prefill),  # a prompt over a cached prefix
])
def test_rule(seq_lens, scheduled, valid, state):
    got = CoarseStatePolicy().decide(batch(seq_lens, scheduled, valid))
    assert got is state
    assert got.is_prefill == (state is CoarseState.Prefill)

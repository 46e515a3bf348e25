"""StepBatch.of_step (the runner's sums) answers every fact and array as the array-built batch does."""

from __future__ import annotations

import numpy as np
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from ascend_kernel.step import StepBatch
from ascend_kernel_plugins.attention.states import StandardStatePolicy


@st.composite
def steps(draw):
    """A step as vLLM's runner sees it: >= 1 token per request, >= 1 of them not a draft; stale rows after n."""
    n = draw(st.integers(1, 40))
    computed = draw(st.lists(st.sampled_from([0, 0, 1, 5, 37]), min_size=n, max_size=n))
    drafts_per_req = draw(st.lists(st.sampled_from([0, 0, 1, 3]), min_size=n, max_size=n))
    extra = draw(st.lists(st.sampled_from([1, 1, 1, 2, 9]), min_size=n, max_size=n))  # non-draft tokens
    if draw(st.booleans()):
        extra = [1] * n
    scheduled = [e + d for e, d in zip(extra, drafts_per_req)]
    stale = draw(st.integers(0, 5))
    computed_rows = np.array(computed + [11] * stale + [0] * 4, dtype=np.int32)  # vLLM's buffer is longer
    req_ids = [f"r{i}" for i in range(n)] + [f"stale{i}" for i in range(stale)]
    drafts = {req_ids[i]: [7] * d for i, d in enumerate(drafts_per_req) if d}
    return n, computed_rows, np.array(scheduled, dtype=np.int32), drafts, req_ids


def array_batch(n, computed, scheduled, drafts, req_ids):
    """How the runner built the batch before: every array explicit."""
    num_draft = np.array([len(drafts.get(r, ())) for r in req_ids[:n]], dtype=np.int64)
    return StepBatch(n, computed[:n] + scheduled, scheduled, scheduled - num_draft, int(scheduled.sum()))


@fuzz(300)
@given(steps())
def test_of_step_facts_and_arrays_equal_the_array_batch(step):
    n, computed, scheduled, drafts, req_ids = step
    fast = StepBatch.of_step(n, computed, scheduled, int(scheduled.sum()), drafts, req_ids if drafts else ())
    slow = array_batch(n, computed, scheduled, drafts, req_ids)
    for fact in ("fresh", "single_token", "single_valid"):
        assert getattr(fast, fact) == getattr(slow, fact), fact
    assert np.array_equal(fast.seq_lens[:n], slow.seq_lens[:n])
    assert np.array_equal(fast.num_valid_tokens[:n], slow.num_valid_tokens[:n])
    for chunked in (True, False):
        policy = StandardStatePolicy(chunked)
        assert policy.decide(fast) is policy.decide(slow)


def test_array_batch_facts_follow_their_definitions():
    b = StepBatch(2, np.array([5, 9, 3]), np.array([5, 9, 1]), np.array([5, 9, 1]), 14)
    assert (b.fresh, b.single_token, b.single_valid) == (True, False, False)
    b = StepBatch(2, np.array([6, 10]), np.array([3, 3]), np.array([1, 1]), 6)
    assert (b.fresh, b.single_token, b.single_valid) == (False, False, True)


def test_unknown_attribute_is_an_attribute_error():
    b = StepBatch(1, np.array([1]), np.array([1]), np.array([1]), 1)
    assert not hasattr(b, "nonsense")
    assert not hasattr(b, "__dict__")


def test_device_counters_sum_without_reading_and_merge_with_host_counters():
    import torch

    from ascend_kernel.step import StepTrace

    trace = StepTrace()
    counts = torch.tensor([3, 0, 4])
    trace.count_on_device("moe_tokens", "alltoall", counts.sum())
    counts.add_(100)  # the caller reuses its buffer: the trace kept its own sum
    trace.count_on_device("moe_tokens", "alltoall", torch.tensor(5))
    trace.count_on_device("moe_tokens", "mc2", torch.tensor(2))
    trace.count("moe_tokens", "mc2", 1)
    trace.count("moe_fallbacks", "mc2->alltoall")
    assert isinstance(trace.device_counters["moe_tokens"]["alltoall"], torch.Tensor)  # not read in the step
    report = trace.as_dict()
    assert report["moe_tokens"] == {"alltoall": 12, "mc2": 3}
    assert report["moe_fallbacks"] == {"mc2->alltoall": 1}

"""The runner's per-step code against the batch semantics it shortcuts.

The runner answers a policy with ``decide_facts`` from a table built at
start-up, keyed by facts it reads from the scheduler's output
(:func:`facts_of_schedule`); a policy without it gets a batch built by sums
from the runner's arrays (:meth:`StepBatch.of_step`). The oracle here is the
other way round: a :class:`StepBatch` built from per-request arrays, whose
facts are computed from those arrays, asked through ``decide``. Random
batches that respect vLLM's scheduler invariants (every request schedules a
token, at least one of them not a draft; the runner's rows are the scheduled
requests, filled from the scheduler's per-request computed counts) must get
the same state every way, and the platform must publish what the step
decided.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from ascend_kernel.platform.common import KernelPlatformMixin
from ascend_kernel.runner import kernel_runner
from ascend_kernel.runner.kernel_runner import KernelRunnerMixin
from ascend_kernel.step import StepBatch, StepTrace, facts_of_schedule
from ascend_kernel_plugins.attention.states import AttentionState, StandardStatePolicy


class DecideOnly:
    """A third-party style policy: only ``decide(batch)``, so the runner builds a batch every step."""

    def __init__(self, inner: StandardStatePolicy) -> None:
        self.inner = inner

    def decide(self, batch: StepBatch) -> AttentionState:
        return self.inner.decide(batch)


class DenseMoEPolicy:
    is_moe = False

    def select(self, num_tokens: int, with_prefill: bool):
        raise AssertionError("the runner asked a policy without experts for a method")


class RecordingMoEPolicy:
    """Names the method after the pass: lets the test see what the runner asked for."""

    is_moe = True

    def __init__(self) -> None:
        self.asked: list[tuple[int, bool]] = []

    def select(self, num_tokens: int, with_prefill: bool):
        self.asked.append((num_tokens, with_prefill))
        return SimpleNamespace(name="prefill-method" if with_prefill else "decode-method")


@pytest.fixture(autouse=True)
def published_step(monkeypatch):
    """A harness runner publishes into the process's LIVE step: put back what was there afterwards."""
    monkeypatch.setattr(kernel_runner.LIVE, "outcome", kernel_runner.LIVE.outcome)


def harness(state_policy, moe_policy) -> KernelRunnerMixin:
    runner = KernelRunnerMixin.__new__(KernelRunnerMixin)  # the per-step part only: no vLLM runner underneath
    runner.kernel_trace = StepTrace()
    runner._bind_step_policies(state_policy, moe_policy)
    return runner


def scheduler_output(computed: list[int], scheduled: list[int], drafts: dict, rng: random.Random):
    """The step as vLLM's scheduler hands it over: new and cached requests, each with its computed count."""
    new, cached = [], []
    for i, c in enumerate(computed):
        # a request without computed tokens may be new or resumed after preemption (a cached one);
        # one with computed tokens may be cached or new with a prefix-cache hit
        (new if rng.random() < 0.5 else cached).append((f"r{i}", c))
    rng.shuffle(cached)
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c) for r, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached],
                                              num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens={f"r{i}": s for i, s in enumerate(scheduled)},
        total_num_scheduled_tokens=sum(scheduled), scheduled_spec_decode_tokens=drafts, ec_manager_metadata=None)


def random_step(rng: random.Random, max_reqs: int = 6):
    """A scheduled step as vLLM hands it over, plus the per-request arrays of the same batch."""
    n = rng.randint(1, max_reqs)
    kind = rng.choice(["fresh", "decode", "verify", "mixed", "cached-prefix"])
    computed, scheduled, drafts = [], [], {}
    for i in range(n):
        if kind == "fresh":
            c, s, d = 0, rng.randint(1, 9), 0
        elif kind == "decode":
            c, s, d = rng.randint(1, 50), 1, 0
        elif kind == "verify":
            d = rng.randint(0, 3)
            c, s = rng.randint(1, 50), 1 + d
        elif kind == "cached-prefix":
            c, s, d = rng.randint(1, 30), rng.randint(2, 9), 0
        else:
            c = rng.choice([0, rng.randint(1, 50)])
            s = 1 if c and rng.random() < 0.5 else rng.randint(1, 9)
            d = rng.randint(0, s - 1) if c and rng.random() < 0.3 else 0
        computed.append(c)
        scheduled.append(s)
        if d:
            drafts[f"r{i}"] = [7] * d
    pad = rng.randint(0, 4)  # vLLM's arrays are sized for max_num_seqs: rows past num_reqs are stale
    computed_cpu = np.array(computed + [rng.randint(0, 99) for _ in range(pad)], dtype=np.int32)
    scheduled_np = np.array(scheduled, dtype=np.int32)
    input_batch = SimpleNamespace(num_reqs=n, num_computed_tokens_cpu=computed_cpu, req_ids=[f"r{i}" for i in range(n)])
    so = scheduler_output(computed, scheduled, drafts, rng)
    valid = np.array([s - len(drafts.get(f"r{i}", ())) for i, s in enumerate(scheduled)], dtype=np.int32)
    oracle = StepBatch(n, np.array(computed, dtype=np.int32) + scheduled_np, scheduled_np, valid,
                       int(scheduled_np.sum()))
    return input_batch, so, scheduled_np, oracle


POLICIES = {
    "chunked": StandardStatePolicy(chunked_prefill=True),
    "no-chunked": StandardStatePolicy(chunked_prefill=False),
    "eagle": StandardStatePolicy(chunked_prefill=True, verify_state=AttentionState.ChunkedPrefill),
    "mtp": StandardStatePolicy(chunked_prefill=True, single_token_state=AttentionState.SpecDecoding),
}


@pytest.mark.parametrize("config", sorted(POLICIES))
@pytest.mark.parametrize("tabulated", [True, False], ids=["decide_facts-table", "decide-per-step"])
def test_step_state_equals_the_array_oracle(config, tabulated, monkeypatch):
    policy = POLICIES[config]
    runner = harness(policy if tabulated else DecideOnly(policy), DenseMoEPolicy())
    assert (runner._outcome_by_facts is not None) == tabulated
    rng = random.Random(hash(config) & 0xFFFF)
    expected_counts: dict[str, int] = {}
    for _ in range(400):
        runner.input_batch, so, scheduled, oracle = random_step(rng)
        assert facts_of_schedule(so, runner) == (oracle.fresh, oracle.single_token, oracle.single_valid)
        runner._kernel_step(so, scheduled)
        want = policy.decide(oracle)
        assert runner.kernel_attn_state is want, (oracle, runner.kernel_attn_state, want)
        assert kernel_runner.LIVE.outcome.is_prefill is want.is_prefill
        extras = KernelPlatformMixin.set_additional_forward_context(num_tokens=int(scheduled.sum()))
        assert extras == {"ascend_attn_state": want, "moe_comm_method": None}
        expected_counts[want.name] = expected_counts.get(want.name, 0) + 1
    trace = runner.kernel_trace.as_dict()
    assert trace["attention_states"] == expected_counts and trace["steps"] == 400
    assert len(expected_counts) >= 3  # the random steps reached several states


def test_outside_a_step_the_platform_publishes_no_state():
    runner = harness(POLICIES["chunked"], DenseMoEPolicy())
    runner.input_batch, so, scheduled, _ = random_step(random.Random(3))
    runner._kernel_step(so, scheduled)
    assert runner.kernel_attn_state is not None and kernel_runner.current_trace() is runner.kernel_trace
    runner._kernel_idle()  # what a dummy run and the drafter's proposal do first
    assert KernelPlatformMixin.set_additional_forward_context(num_tokens=8) == \
        {"ascend_attn_state": None, "moe_comm_method": None}
    assert kernel_runner.current_trace() is None and kernel_runner.current_attn_state() is None


def test_the_encoder_cache_managers_counts_reach_the_trace_with_the_step():
    """A multimodal model's scheduler sends its encoder counts (totals) with each step; the last ones stand."""
    from ascend_kernel_plugins.layers.encoder_cache import EncoderCounts

    runner = harness(POLICIES["chunked"], DenseMoEPolicy())
    rng = random.Random(7)
    runner.input_batch = SimpleNamespace(num_reqs=1, num_computed_tokens_cpu=np.zeros(4, dtype=np.int32),
                                         req_ids=["r0"])
    assert "encoder" not in runner.kernel_trace.as_dict()  # vLLM's own manager sends None
    for runs, hits in ((1, 0), (2, 1)):
        so = scheduler_output([0], [4], {}, rng)
        so.ec_manager_metadata = EncoderCounts(runs, hits)
        runner._kernel_step(so, np.array([4], dtype=np.int32))
    assert runner.kernel_trace.as_dict()["encoder"] == {"encoder_runs": 2, "encoder_cache_hits": 1}


def test_a_model_with_experts_gets_a_method_per_forward_pass():
    moe = RecordingMoEPolicy()
    runner = harness(POLICIES["chunked"], moe)
    rng = random.Random(5)
    computed = np.zeros(8, dtype=np.int32)
    runner.input_batch = SimpleNamespace(num_reqs=2, num_computed_tokens_cpu=computed, req_ids=["r0", "r1"])
    runner._kernel_step(scheduler_output([0, 0], [4, 5], {}, rng), np.array([4, 5], dtype=np.int32))
    prefill = KernelPlatformMixin.set_additional_forward_context(num_tokens=9)
    computed[:2] = [4, 5]
    runner._kernel_step(scheduler_output([4, 5], [1, 1], {}, rng), np.array([1, 1], dtype=np.int32))
    decode = KernelPlatformMixin.set_additional_forward_context(num_tokens=2)
    runner._kernel_idle()
    dummy = KernelPlatformMixin.set_additional_forward_context(num_tokens=16)
    assert moe.asked == [(9, True), (2, False), (16, False)]
    assert prefill["ascend_attn_state"] is AttentionState.PrefillNoCache
    assert prefill["moe_comm_method"].name == "prefill-method"
    assert decode["ascend_attn_state"] is AttentionState.DecodeOnly
    assert decode["moe_comm_method"].name == "decode-method"
    assert dummy["ascend_attn_state"] is None and dummy["moe_comm_method"].name == "decode-method"
    # dummy passes are not counted
    assert runner.kernel_trace.as_dict()["moe_methods"] == {"prefill-method": 1, "decode-method": 1}


def test_the_wrapped_vllm_methods_are_the_ones_super_would_call():
    """The step calls vLLM's _prepare_inputs and _sample through functions resolved per class, not super()."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from ascend_kernel.runner.cpu import KernelCPUModelRunner

    class Base:
        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
            return "base-prepare"

        def _sample(self, logits, spec_decode_metadata):
            return "base-sample"

    class Middle(Base):
        def _sample(self, logits, spec_decode_metadata):
            return "middle-sample"

    class Runner(KernelRunnerMixin, Middle):
        pass

    for name in ("_prepare_inputs", "_sample"):
        assert getattr(KernelCPUModelRunner, f"_vllm{name}") is getattr(CPUModelRunner, name)
        assert getattr(Runner, f"_vllm{name}") is getattr(super(KernelRunnerMixin, Runner), name)
    runner = harness(POLICIES["chunked"], DenseMoEPolicy())
    runner.__class__ = Runner
    runner.kernel_trace = StepTrace()
    assert runner._sample(None, None) == "middle-sample" and runner.kernel_trace.sampler_calls == 1

"""The kernel runner: the seams of vLLM's V1 runner, answered by the chosen plugins.

:class:`KernelRunnerMixin` sits in front of vLLM's runner class
(``CPUModelRunner`` on CPU, ``GPUModelRunner`` over the device seam on NPU)
and replaces exactly the feature decisions the Ascend runner used to make with
``if/elif``: sampler, rejection sampler, drafter, KV-cache tensors, per-step
attention state and MoE method, graph capture. Everything is bound at init;
the step calls plain methods on the plan's objects (no pluggy in the loop).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any, Callable

import numpy as np

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.runner.kv_allocation import KVAllocationReport, allocate_kv_caches
from ascend_kernel.step import StepBatch, StepTrace, facts_of_schedule

logger = logging.getLogger("ascend_kernel")


class StepOutcome:
    """What a step in one attention state publishes, and how many steps had it.

    One object per distinct state and runner, built the first time the state
    is decided (for a policy with ``decide_facts``, all at start-up), so a
    step only points :data:`LIVE` at it and counts.
    """

    __slots__ = ("state", "name", "is_prefill", "extras", "runner", "steps")

    def __init__(self, state: Any, name: str, is_prefill: bool, extras: dict[str, Any] | None,
                 runner: "KernelRunnerMixin | None") -> None:
        self.state = state
        self.name = name
        self.is_prefill = is_prefill
        #: vLLM's forward-context extras for every pass of the step, or None when they depend on the pass (MoE)
        self.extras = extras
        self.runner = runner
        self.steps = 0


class LiveStep:
    """The step this process's forward passes belong to: one slot, written once per step.

    The platform's forward-context hook and the backends read it on every
    pass; keeping it in one small object (not in the runner's large instance
    dict) is what makes those reads cheap when the caches are cold.
    """

    __slots__ = ("outcome",)

    def __init__(self, outcome: StepOutcome) -> None:
        self.outcome = outcome


#: before any kernel runner exists: no state, nothing added to the forward context
NO_RUNNER = StepOutcome(None, "", False, {}, None)
#: the published step of this process (a kernel runner points it at its outcome of each step, or its idle one)
LIVE = LiveStep(NO_RUNNER)


def current_attn_state() -> Any:
    """The attention state of the current step.

    None before the first step and in passes that are not a scheduled step's
    (dummy, profile and capture runs, the drafter's proposals).
    """
    return LIVE.outcome.state


def current_trace() -> StepTrace | None:
    """The stepping runner's trace while a scheduled step runs, for plugins that count per-step facts.

    None outside a step (no engine, vLLM's dummy, profile and capture runs, the
    drafter's proposals), so that counts describe the target's steps and nothing else.
    """
    outcome = LIVE.outcome
    return outcome.runner.kernel_trace if outcome.state is not None else None


def attn_modules_per_layer(layer_names: Any) -> int:
    """How many attention modules share one decoder-layer index, from the KV layers' names.

    vLLM orders KV caches by layer index and needs this count when a layer
    holds several attention modules, named with a second index
    (``model.layers.3.self_attn.1.attn``: LongCat-Flash). vLLM's runner keys it
    on the model type; the names say it for any model: the most modules found
    under one layer index, 1 when no name carries a second index.
    """
    per_layer: dict[int, int] = {}
    for name in layer_names:
        indices = [int(part) for part in name.split(".") if part.isdigit()]
        if len(indices) == 2:
            per_layer[indices[0]] = per_layer.get(indices[0], 0) + 1
    return max(per_layer.values(), default=1)


class KernelRunnerMixin:
    """Routes the runner's feature seams through the kernel's plan."""

    #: vLLM's own methods the step wraps, found once per runner class (:meth:`__init_subclass__`)
    _vllm_prepare_inputs: Callable[..., Any]
    _vllm_sample: Callable[..., Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Resolve once, per concrete runner class, the vLLM methods the step wraps.

        ``super()._prepare_inputs(...)`` builds a super object and walks the
        class dicts after the mixin on every call; in a step, where the caches
        are cold, that costs microseconds. The wrapped method is found here
        the same way super() would find it (the classes after the mixin in
        the subclass's MRO) and kept as ``_vllm_<name>``.
        """
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        after_mixin = mro[mro.index(KernelRunnerMixin) + 1:]
        for name in ("_prepare_inputs", "_sample"):
            for klass in after_mixin:
                if name in klass.__dict__:
                    setattr(cls, f"_vllm{name}", klass.__dict__[name])
                    break

    def __init__(self, vllm_config: Any, device: Any) -> None:
        super().__init__(vllm_config, device)  # type: ignore[call-arg]
        self.kernel = kernel_mod.activate(vllm_config, configure=False)
        plan = self.kernel.resolve(vllm_config)
        self.kernel_plan = plan
        # before load_model builds the layers: vLLM picks custom-op classes and modules at construction
        plan.layer_ops.install()
        self.kernel_model_patches: list[str] = []
        for chosen in plan.objects():
            prepare_model = getattr(chosen, "prepare_model", None)
            if prepare_model is not None:
                self.kernel_model_patches.extend(prepare_model(vllm_config))
        self.kernel_trace = StepTrace()
        self.kernel_kv_report = KVAllocationReport()
        # Sampling and drafting objects replace what vLLM's __init__ built.
        self.sampler = plan.sampler.build(vllm_config)
        if plan.drafter is not None:
            self.drafter = plan.drafter.build(self)
        if plan.rejection_sampler is not None:
            self.rejection_sampler = plan.rejection_sampler.build(self.sampler, vllm_config, self.device)
        # last: from here on this runner's steps are what the process's forward passes see
        self._bind_step_policies(plan.attention_state, plan.moe_comm, plan.tp_comm)

    def _bind_step_policies(self, state_policy: Any, moe_policy: Any, tp_policy: Any = None) -> None:
        """Bind the per-step policies once, tabulate what a step needs from them, and publish the idle state."""
        self._decide_attn_state = state_policy.decide
        # a policy with experts to serve is asked per forward pass; without, the runner never calls it
        self._select_moe_comm = moe_policy.select if getattr(moe_policy, "is_moe", True) else None
        self._select_tp_comm = getattr(tp_policy, "select", None)  # None: always all-reduce, nothing per pass
        self._kernel_outcomes: dict[int, StepOutcome] = {}
        self._kernel_idle_outcome = self._outcome_of(None)
        idle = self._kernel_idle_outcome
        self._kernel_dummy_outcome = StepOutcome(None, "dummy-batch", False, idle.extras, self)
        decide_facts = getattr(state_policy, "decide_facts", None)
        self._outcome_by_facts: dict[tuple[bool, bool, bool], StepOutcome] | None = None
        if decide_facts is not None:
            self._outcome_by_facts = {facts: self._outcome_of(decide_facts(*facts))
                                      for facts in itertools.product((False, True), repeat=3)}
        LIVE.outcome = self._kernel_idle_outcome

    # -- per step ---------------------------------------------------------------
    #
    # The step state is published by _prepare_inputs (LIVE.outcome) and holds until the next step, a
    # dummy run or the drafter's proposal: those run forward passes of their own and see the idle state.
    # No wrapper around execute_model: nothing per step is added that a rare method can do instead.

    def _outcome_of(self, state: Any) -> StepOutcome:
        """This runner's outcome for attention state ``state`` (None: outside a step), built once per state."""
        outcome = self._kernel_outcomes.get(id(state))
        if outcome is None:
            name, is_prefill = ("", False) if state is None else (state.name, bool(state.is_prefill))
            # Without experts the forward context is the same for every pass of the step: built once, here.
            extras = ({"ascend_attn_state": state, "moe_comm_method": None}
                      if self._select_moe_comm is None and self._select_tp_comm is None else None)
            outcome = self._kernel_outcomes[id(state)] = StepOutcome(state, name, is_prefill, extras, self)
            if state is not None:
                self.kernel_trace.state_counters.append(outcome)
        return outcome

    def _kernel_idle(self) -> None:
        """Forward passes outside a scheduled step (dummy, profile, capture, drafting) see no step state."""
        LIVE.outcome = self._kernel_idle_outcome

    @property
    def kernel_attn_state(self) -> Any:
        """This runner's attention state for the step being run (None outside a step, or another runner's)."""
        outcome = LIVE.outcome
        return outcome.state if outcome.runner is self else None

    def _prepare_inputs(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray):
        out = self._vllm_prepare_inputs(scheduler_output, num_scheduled_tokens)  # type: ignore[attr-defined]
        self._kernel_step(scheduler_output, num_scheduled_tokens)
        return out

    def _kernel_step(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> None:
        """The kernel's decisions for one scheduled step: the attention state, published and counted.

        A policy with ``decide_facts`` is answered from the table built at
        start-up, keyed by three facts read from the scheduler's output
        (:func:`facts_of_schedule`); any other gets a :class:`StepBatch`. With
        the platform's forward-context hook this is the kernel's whole
        per-step cost (``bench/step_overhead.py`` times it inside a live
        engine): a lookup, one slot written, one slot counted, and one attribute read: the counts a plugin's
        encoder cache manager sends with the step (None but for a multimodal model), written into the trace.
        """
        table = self._outcome_by_facts
        if table is not None:
            outcome = table[facts_of_schedule(scheduler_output, self)]
        else:
            state = self._decide_attn_state(self._step_batch(scheduler_output, num_scheduled_tokens))
            outcome = self._outcome_of(state)
        LIVE.outcome = outcome
        outcome.steps += 1
        metadata = scheduler_output.ec_manager_metadata
        if metadata is not None and hasattr(metadata, "count_into"):
            metadata.count_into(self.kernel_trace)

    def _step_batch(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> StepBatch:
        """The step's batch from what vLLM already computed (its facts are sums; see StepBatch.of_step)."""
        batch = self.input_batch  # type: ignore[attr-defined]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        return StepBatch.of_step(batch.num_reqs, batch.num_computed_tokens_cpu, num_scheduled_tokens,
                                 scheduler_output.total_num_scheduled_tokens, drafts,
                                 batch.req_ids if drafts else ())

    def kernel_forward_extras(self, num_tokens: int | None) -> dict[str, Any]:
        """The forward context's extras for one pass of this runner's current step (or of an idle pass).

        The platform's hook returns the published outcome's prebuilt extras
        and calls this only when they are None: a model with experts, whose
        MoE method depends on the pass's token count (the step, the drafter
        and dummy runs differ), or a TP-communication policy that chooses per
        pass (sequence parallel or all-reduce, by the pass's token count).
        """
        outcome = LIVE.outcome
        if outcome.extras is not None:
            return outcome.extras
        state, select_moe, select_tp = outcome.state, self._select_moe_comm, self._select_tp_comm
        method = select_moe(num_tokens or 0, outcome.is_prefill) if select_moe is not None else None
        if state is not None and method is not None:
            self.kernel_trace.moe_methods[method.name] += 1
        elif outcome is self._kernel_dummy_outcome and method is not None:
            self.kernel_trace.count("dummy_batch_moe_methods", method.name)
        # profile, capture and drafting passes (no attention state) still need a method, but are not counted
        # the TP-communication choice (None: all-reduce); a scheduled step's is counted by its policy
        tp_comm = select_tp(num_tokens or 0, self.kernel_trace if state is not None else None) if select_tp else None
        return {"ascend_attn_state": state, "moe_comm_method": method, "tp_comm": tp_comm}

    def kernel_dummy_batch(self, run: Any) -> Any:
        """An idle DP rank's share of a step (``run``: vLLM's dummy batch), published and counted as such."""
        LIVE.outcome = self._kernel_dummy_outcome
        self.kernel_trace.count("dummy_batches", "total")
        try:
            return run()
        finally:
            LIVE.outcome = self._kernel_idle_outcome

    def _dummy_run(self, *args: Any, **kwargs: Any):
        if LIVE.outcome is not self._kernel_dummy_outcome:
            self._kernel_idle()
        return super()._dummy_run(*args, **kwargs)  # type: ignore[misc]

    def _sample(self, logits: Any, spec_decode_metadata: Any):
        trace = self.kernel_trace
        if spec_decode_metadata is None:
            trace.sampler_calls += 1
        else:
            trace.rejection_sampler_calls += 1
        return self._vllm_sample(logits, spec_decode_metadata)  # type: ignore[attr-defined]

    def propose_draft_token_ids(self, *args: Any, **kwargs: Any):
        self._kernel_idle()  # the draft model's passes are not the target's step
        self.kernel_trace.drafter_calls += 1
        return super().propose_draft_token_ids(*args, **kwargs)  # type: ignore[misc]

    # -- start-up -----------------------------------------------------------------

    def initialize_kv_cache_tensors(self, kv_cache_config: Any, kernel_block_sizes: list[int],
                                    kv_cache_allocation_context: Any = None) -> dict[str, Any]:
        from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

        with kv_cache_allocation_context or contextlib.nullcontext():
            caches, report = allocate_kv_caches(
                kv_cache_config,
                layout_for=lambda spec_type: self.kernel.kv_layout(spec_type, self.vllm_config),
                vllm_config=self.vllm_config,
                device=self.kernel.device,
                torch_device=self.device,
                kernel_block_sizes=kernel_block_sizes,
                runner_only_layers=self.runner_only_attn_layers,
                borrowed_layers=set(self.shared_kv_cache_layers),
            )
        self.kernel_kv_report = report
        for layer, target in self.shared_kv_cache_layers.items():
            caches[layer] = caches[target]
        groups = [g for per_group in self.attn_groups for g in per_group]
        if self.speculative_config:
            groups += getattr(self.drafter, "draft_attn_groups", [])
        bind_kv_cache(
            caches,
            self.compilation_config.static_forward_context,
            self.kv_caches,
            attn_modules_per_layer(caches),
            kv_cache_groups=kv_cache_config.kv_cache_groups,
            layer_kv_caches=map_kv_caches_to_kernel_blocks(caches, groups),
        )
        return caches

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's loading (inside each chosen object's ``model_build_scope``: module swaps that last only while
        the model and its drafter are built), the plugins' ``ascend_kernel_model_loaded`` (EPLB builds vLLM's
        ``EplbState`` there), then the graph mode's wrapping of the whole model, if it has one."""
        with contextlib.ExitStack() as scopes:
            for chosen in self.kernel_plan.objects():
                scope = getattr(chosen, "model_build_scope", None)
                if scope is not None:
                    self.kernel_model_patches.extend(
                        n for n in scopes.enter_context(scope(self.vllm_config)) if n not in self.kernel_model_patches)
            super().load_model(*args, **kwargs)  # type: ignore[misc]
        self.kernel.plugins.call_each("ascend_kernel_model_loaded", runner=self)  # before a graph wrapper hides it
        wrap_model = getattr(self.kernel_plan.graph, "wrap_model", None)
        if wrap_model is not None:
            self.model = wrap_model(self.model, self.vllm_config)

    def get_model(self) -> Any:
        """The loaded model itself, never a graph wrapper around it (vLLM's runner unwraps only its own)."""
        model = super().get_model()  # type: ignore[misc]
        unwrap = getattr(type(model), "unwrap", None)
        return model.unwrap() if callable(unwrap) else model

    def capture_model(self) -> int:
        return self.kernel_plan.graph.capture(self, super().capture_model)  # type: ignore[misc]

    # -- reporting ----------------------------------------------------------------

    def kernel_report(self) -> dict[str, Any]:
        report = self.kernel.report()
        report["kv_cache"] = self.kernel_kv_report.as_dict()
        report["trace"] = self.kernel_trace.as_dict()
        from ascend_kernel.ops import provider_name
        from ascend_kernel.ops.pass_manager import fusion_report

        plan = self.kernel_plan
        for family, empty in (("layer_ops", {}), ("graph", {}), ("quantization", None), ("moe_comm", {}),
                              ("drafter", None), ("tp_comm", {})):  # each chosen object's own account, if any
            describe = getattr(getattr(plan, family), "describe", None)
            report[family] = describe() if describe is not None else empty
        report["fusion"] = fusion_report(self.kernel)
        report["model_patches"] = self.kernel_model_patches
        report["ops_provider"] = provider_name(self.kernel.settings.ops_provider, self.kernel.device_info.kind)
        report["sampler_class"] = type(self.sampler).__module__ + "." + type(self.sampler).__qualname__
        drafter = getattr(self, "drafter", None)
        report["drafter_class"] = (type(drafter).__module__ + "." + type(drafter).__qualname__) if drafter else None
        return report

"""The kernel runner: the seams of vLLM's V1 runner, answered by the chosen plugins.

:class:`KernelRunnerMixin` sits in front of vLLM's runner class
(``CPUModelRunner`` on CPU, ``GPUModelRunner`` over the device seam on NPU)
and replaces exactly the feature decisions the Ascend runner used to make with
``if/elif``: sampler, rejection sampler, drafter, KV-cache tensors, per-step
attention state and MoE method, graph capture. Everything is bound at init;
the step calls plain methods on the plan's objects (no pluggy in the loop).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, NamedTuple

import numpy as np

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.runner.kv_allocation import KVAllocationReport, allocate_kv_caches
from ascend_kernel.step import StepBatch, StepTrace

logger = logging.getLogger("ascend_kernel")

#: the runner of this process whose step state the platform publishes
_active_runner: "KernelRunnerMixin | None" = None


def current_attn_state() -> Any:
    """The attention state of the active runner's current step.

    None before the first step and in passes that are not a scheduled step's
    (dummy, profile and capture runs, the drafter's proposals).
    """
    runner = _active_runner
    return runner.kernel_attn_state if runner is not None else None


def current_trace() -> StepTrace | None:
    """The active runner's step trace while a scheduled step runs, for plugins that count per-step facts.

    None outside a step (no engine, vLLM's dummy, profile and capture runs, the
    drafter's proposals), so that counts describe the target's steps and nothing else.
    """
    runner = _active_runner
    if runner is None or runner.kernel_attn_state is None:
        return None
    return runner.kernel_trace


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


class StepOutcome(NamedTuple):
    """What one step's attention state makes the runner publish, computed once per distinct state."""

    state: Any
    name: str
    is_prefill: bool
    #: vLLM's forward-context extras for every pass of the step, or None when they depend on the pass (MoE)
    extras: dict[str, Any] | None


class KernelRunnerMixin:
    """Routes the runner's feature seams through the kernel's plan."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        global _active_runner
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
        self._bind_step_policies(plan.attention_state, plan.moe_comm)
        # Sampling and drafting objects replace what vLLM's __init__ built.
        self.sampler = plan.sampler.build(vllm_config)
        if plan.drafter is not None:
            self.drafter = plan.drafter.build(self)
        if plan.rejection_sampler is not None:
            self.rejection_sampler = plan.rejection_sampler.build(self.sampler, vllm_config, self.device)
        _active_runner = self

    def _bind_step_policies(self, state_policy: Any, moe_policy: Any) -> None:
        """Bind the per-step policies once; what a step needs from them is tabulated where it can be."""
        self._decide_attn_state = state_policy.decide
        # a policy with experts to serve is asked per forward pass; without, the runner never calls it
        self._select_moe_comm = moe_policy.select if getattr(moe_policy, "is_moe", True) else None
        self._kernel_outcome: StepOutcome = self._outcome_of(None)
        self._kernel_idle_outcome = self._kernel_outcome
        decide_facts = getattr(state_policy, "decide_facts", None)
        self._outcome_by_facts: dict[tuple[bool, bool, bool], StepOutcome] | None = None
        if decide_facts is not None:
            self._outcome_by_facts = {facts: self._outcome_of(decide_facts(*facts))
                                      for facts in itertools.product((False, True), repeat=3)}
        self._publish(self._kernel_idle_outcome)

    # -- per step ---------------------------------------------------------------
    #
    # The step state (attention state, prefill flag, forward-context extras) is set by _prepare_inputs
    # and holds until the next step, a dummy run or the drafter's proposal: those run forward passes
    # of their own and see the idle state. No wrapper around execute_model: nothing per step is added
    # that a rare method can do instead.

    def _outcome_of(self, state: Any) -> "StepOutcome":
        """What a step with attention state ``state`` publishes (None: outside a step)."""
        if state is None:
            name, is_prefill = "", False
        else:
            name, is_prefill = state.name, bool(state.is_prefill)
        # Without experts the forward context is the same for every pass of the step: built once, here.
        extras = {"ascend_attn_state": state, "moe_comm_method": None} if self._select_moe_comm is None else None
        return StepOutcome(state, name, is_prefill, extras)

    def _publish(self, outcome: "StepOutcome") -> None:
        self._kernel_outcome = outcome
        self.kernel_attn_state, _, self._kernel_with_prefill, self.kernel_step_extras = outcome

    def _kernel_idle(self) -> None:
        """Forward passes outside a scheduled step (dummy, profile, capture, drafting) see no step state."""
        self._publish(self._kernel_idle_outcome)

    def _prepare_inputs(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray):
        out = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)  # type: ignore[misc]
        self._kernel_step(scheduler_output, num_scheduled_tokens)
        return out

    def _kernel_step(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> None:
        """The kernel's decisions for one scheduled step: the attention state, counted in the trace.

        A policy with ``decide_facts`` is answered from the table built at
        start-up (the step computes three facts by sums and looks them up);
        any other gets a :class:`StepBatch`. With the platform's forward-context
        hook this is the kernel's whole per-step cost (``bench/step_overhead.py``
        times it inside a live engine).
        """
        table = self._outcome_by_facts
        if table is not None:
            batch = self.input_batch  # type: ignore[attr-defined]
            outcome = table[StepBatch.facts_of_step(batch.num_reqs, batch.num_computed_tokens_cpu,
                                                    scheduler_output.total_num_scheduled_tokens,
                                                    scheduler_output.scheduled_spec_decode_tokens)]
        else:
            state = self._decide_attn_state(self._step_batch(scheduler_output, num_scheduled_tokens))
            outcome = self._kernel_outcome
            if state is not outcome.state:
                outcome = self._outcome_of(state)
        # published here, not through _publish: one frame less per step
        self._kernel_outcome = outcome
        self.kernel_attn_state, name, self._kernel_with_prefill, self.kernel_step_extras = outcome
        self.kernel_trace.attention_states[name] += 1

    def _step_batch(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> StepBatch:
        """The step's batch from what vLLM already computed (its facts are sums; see StepBatch.of_step)."""
        batch = self.input_batch  # type: ignore[attr-defined]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        return StepBatch.of_step(batch.num_reqs, batch.num_computed_tokens_cpu, num_scheduled_tokens,
                                 scheduler_output.total_num_scheduled_tokens, drafts,
                                 batch.req_ids if drafts else ())

    def kernel_forward_extras(self, num_tokens: int | None) -> dict[str, Any]:
        """The forward context's extras for one pass: the step's, or with the MoE method for ``num_tokens``.

        The platform reads :attr:`kernel_step_extras` first and only calls this
        when it is None (a model with experts: the method depends on the pass's
        token count, which differs between the step, the drafter and dummy runs).
        """
        extras = self.kernel_step_extras
        if extras is not None:
            return extras
        state = self.kernel_attn_state
        method = self._select_moe_comm(num_tokens or 0, self._kernel_with_prefill)
        if state is not None and method is not None:
            self.kernel_trace.moe_methods[method.name] += 1
        # dummy and profile runs (no attention state) still need a method, but are not counted
        return {"ascend_attn_state": state, "moe_comm_method": method}

    def _dummy_run(self, *args: Any, **kwargs: Any):
        self._kernel_idle()
        return super()._dummy_run(*args, **kwargs)  # type: ignore[misc]

    def _sample(self, logits: Any, spec_decode_metadata: Any):
        if spec_decode_metadata is None:
            self.kernel_trace.sampler_calls += 1
        else:
            self.kernel_trace.rejection_sampler_calls += 1
        return super()._sample(logits, spec_decode_metadata)  # type: ignore[misc]

    def propose_draft_token_ids(self, *args: Any, **kwargs: Any):
        self._kernel_idle()  # the draft model's passes are not the target's step
        self.kernel_trace.drafter_calls += 1
        return super().propose_draft_token_ids(*args, **kwargs)  # type: ignore[misc]

    # -- start-up -----------------------------------------------------------------

    def initialize_kv_cache_tensors(self, kv_cache_config: Any, kernel_block_sizes: list[int],
                                    kv_cache_allocation_context: Any = None) -> dict[str, Any]:
        from contextlib import nullcontext

        from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

        kernel = self.kernel
        with kv_cache_allocation_context or nullcontext():
            caches, report = allocate_kv_caches(
                kv_cache_config,
                layout_for=lambda spec_type: kernel.kv_layout(spec_type, self.vllm_config),
                vllm_config=self.vllm_config,
                device=kernel.device,
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

    def capture_model(self) -> int:
        return self.kernel_plan.graph.capture(self, super().capture_model)  # type: ignore[misc]

    # -- reporting ----------------------------------------------------------------

    def kernel_report(self) -> dict[str, Any]:
        report = self.kernel.report()
        report["kv_cache"] = self.kernel_kv_report.as_dict()
        report["trace"] = self.kernel_trace.as_dict()
        from ascend_kernel.ops import provider_name

        report["layer_ops"] = self.kernel_plan.layer_ops.describe()
        report["model_patches"] = self.kernel_model_patches
        describe_moe = getattr(self.kernel_plan.moe_comm, "describe", None)
        report["moe_comm"] = describe_moe() if describe_moe is not None else {}
        report["ops_provider"] = provider_name(self.kernel.settings.ops_provider, self.kernel.device_info.kind)
        report["sampler_class"] = type(self.sampler).__module__ + "." + type(self.sampler).__qualname__
        drafter = getattr(self, "drafter", None)
        report["drafter_class"] = (type(drafter).__module__ + "." + type(drafter).__qualname__) if drafter else None
        describe_drafter = getattr(self.kernel_plan.drafter, "describe", None)
        report["drafter"] = describe_drafter() if describe_drafter is not None else None
        return report

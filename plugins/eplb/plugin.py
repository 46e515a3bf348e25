"""The EPLB plugin: admits EPLB on the kernel's platforms and gives the runner vLLM's ``EplbState``.

Three hooks: its settings; ``ascend_kernel_configure`` (admission:
:mod:`.admission`); ``ascend_kernel_model_loaded``, where, with EPLB on, it
chooses the ``eplb_policy`` (family hook ``ascend_kernel_eplb_policies``),
builds :class:`.state.KernelEplbState` over the loaded model and hands it
to the runner. From then on vLLM's own runner code steps it: ``prepare_forward``
before every forward pass, ``eplb_step`` after every step and dummy run.
The kernel's MoE layers read the live maps and record their load through
``attach_eplb`` (``plugins/moe_comm/eplb_map.py``).
"""

from __future__ import annotations

from typing import Any

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.errors import KernelError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel_plugins.eplb.settings import EplbSettings

FAMILY = "eplb_policy"
POLICY_SETTING = "eplb_config.policy"


@hookimpl
def ascend_kernel_settings() -> type[EplbSettings]:
    return EplbSettings


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any) -> list[Any]:
    from ascend_kernel_plugins.eplb.admission import admit, eplb_config_of

    changes = admit(settings, vllm_config, getattr(device, "kind", "cpu"))
    if settings.enable_eplb:  # an unknown policy name stops start-up here, not at the first rearrangement
        choose_policy(kernel_mod.current(), vllm_config, eplb_config_of(settings.eplb_config)[1])
    return changes


def choose_policy(kernel: Any, vllm_config: Any, name: str | None) -> Any:
    """The ``eplb_policy`` object (its decision recorded once per process, for ``explain`` and the report)."""
    from ascend_kernel.registry import choose

    entries = kernel.plugins.implementations("ascend_kernel_eplb_policies", FAMILY)
    ctx = kernel.context(vllm_config)
    impl, record = choose(FAMILY, entries, ctx, forced=name, forcing_setting=POLICY_SETTING)
    if not any(r.family == FAMILY for r in kernel.records):
        kernel.records.append(record)
    return impl.build(ctx)


@hookimpl
def ascend_kernel_model_loaded(runner: Any) -> list[str] | None:
    parallel = runner.vllm_config.parallel_config
    if not parallel.enable_eplb:
        return None
    from vllm.distributed import get_ep_group
    from vllm.model_executor.models.interfaces import get_mixture_of_experts_model

    from ascend_kernel.upstream import set_runner_moe_model
    from ascend_kernel_plugins.eplb.admission import eplb_config_of
    from ascend_kernel_plugins.eplb.state import KernelEplbState

    model = get_mixture_of_experts_model(runner.get_model())
    if model is None:
        raise KernelError(f"enable_eplb needs a model that implements vLLM's MixtureOfExperts; "
                          f"{type(runner.get_model()).__name__} does not (DeepSeek-V2/V3, Qwen3-MoE and Mixtral do)")
    methods = [layer.routed_experts.quant_method for layer in model.moe_layers]
    unserved = [type(m).__name__ for m in methods if not hasattr(m, "attach_eplb")]
    if unserved:
        raise KernelError(f"enable_eplb needs the kernel's MoE layer in every MoE layer; {unserved[0]} keeps "
                          "vLLM's kernel here (see the moe_comm plugin's log for why)")
    kernel = runner.kernel
    settings = kernel.settings
    policy = choose_policy(kernel, runner.vllm_config, eplb_config_of(settings.eplb_config)[1])
    state = KernelEplbState(parallel, runner.device, policy, get_ep_group().world_size,
                            settings.eplb_record_path, settings.eplb_replay_path)
    state.attach(model, methods)
    state.add_model(model, runner.model_config)
    runner.eplb_state = state
    set_runner_moe_model(runner, model)
    runner.kernel_trace.counters["eplb"] = state.report  # the report's eplb object, per rank
    return [f"EPLB over {model.num_moe_layers} MoE layers, policy {state.report['policy']}"]

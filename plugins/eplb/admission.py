"""Admission of ``--enable-eplb`` / ``--eplb-config`` on the kernel's platforms, as recorded config changes.

vLLM's ``ParallelConfig`` refuses EPLB unless the platform is CUDA-alike or
XPU, before any platform hook runs. The kernel's CLI therefore hands the two
engine arguments to this plugin's settings (``enable_eplb``, ``eplb_config``)
instead of to vLLM, and this module, from the platform's configure step,
checks them against the deployment and sets them on vLLM's config, each
change recorded with its reason:

* ``parallel_config.enable_eplb`` and ``parallel_config.eplb_config`` (the
  user's fields, validated by vLLM's own ``EPLBConfig``);
* ``eplb_config.use_async`` -> False: the rearrangement runs synchronously
  between steps (vLLM's async worker needs device streams and events; CPU
  torch events cannot ``record()``);
* ``eplb_config.communicator``, unless the user named one: on an NPU
  ``torch_nccl``, vLLM's ``torch.distributed`` isend/irecv communicator over
  the EP group's device group, which is HCCL there: expert weights move
  device to device (vLLM avoids it on CUDA for async EPLB's stream conflicts
  and NCCL's batched-send hangs; the kernel's rearrangement is synchronous);
  on a CPU device ``torch_gloo``, the EP group's gloo twin (vLLM's staged
  communicator, what vLLM picks itself where NIXL is absent). ``pynccl`` and
  ``nixl`` are CUDA-only and refused.

A configuration the deployment cannot run stops start-up here with the reason.
"""

from __future__ import annotations

import json
from typing import Any

from ascend_kernel.config_changes import ConfigChange, change
from ascend_kernel.errors import KernelError

#: the eplb_config key that names the kernel's policy (vLLM's own field only knows "default")
POLICY_KEY = "policy"
REFUSED_HERE = "vLLM's ParallelConfig refuses EPLB off CUDA/XPU; on the kernel's platforms the eplb plugin runs it"
#: device kind -> the weight mover vLLM's EplbState builds (an ``eplb_config.communicator`` name), and why
COMMUNICATOR_FOR = {
    "npu": ("torch_nccl", "expert weights move device to device over the EP group's device group (HCCL): "
                          "vLLM's torch.distributed isend/irecv communicator, run synchronously"),
    "cpu": ("torch_gloo", "expert weights move over the EP group's gloo twin (vLLM's staged communicator)"),
}
#: vLLM's communicators that need CUDA (NCCL through pynccl, NIXL RDMA)
CUDA_ONLY_COMMUNICATORS = ("pynccl", "nixl")


def eplb_config_of(given: dict[str, Any] | str) -> tuple[Any, str]:
    """vLLM's ``EPLBConfig`` for the user's fields (synchronous), and the policy name they asked for.

    ``given`` is the fields, or the setting's JSON text of them (empty: vLLM's defaults).
    """
    from pydantic import ValidationError
    from vllm.config.parallel import EPLBConfig

    fields = dict(json.loads(given) if isinstance(given, str) and given.strip() else given or {})
    policy = str(fields.pop(POLICY_KEY, "default"))
    if fields.get("use_async"):
        raise KernelError("eplb_config use_async=True is not available on the kernel's platforms: the "
                          "rearrangement runs synchronously between steps (allowed: use_async false or unset)")
    fields["use_async"] = False
    try:
        return EPLBConfig(**fields), policy
    except (ValidationError, TypeError, ValueError) as exc:
        known = "window_size, step_interval, num_redundant_experts, log_balancedness, log_balancedness_interval, " \
                "policy"
        raise KernelError(f"eplb_config {given!r} is not a valid EPLB config ({known}): {exc}") from None


def check_deployment(vllm_config: Any, num_redundant: int) -> None:
    """Refuse what this deployment cannot run, naming what is wrong and what is allowed."""
    parallel = vllm_config.parallel_config
    if not parallel.enable_expert_parallel:
        raise KernelError("enable_eplb needs enable_expert_parallel=True (EPLB moves experts between the ranks "
                          "of the expert-parallel group)")
    ep_size = parallel.tensor_parallel_size * parallel.data_parallel_size * parallel.prefill_context_parallel_size
    if ep_size <= 1:
        raise KernelError(f"enable_eplb needs an expert-parallel group of at least 2 ranks (tensor x data "
                          f"parallel); got {ep_size}")
    experts = vllm_config.model_config.get_num_experts() if vllm_config.model_config is not None else 0
    if experts == 0:
        raise KernelError(f"enable_eplb needs a mixture-of-experts model; {vllm_config.model_config.model} has no "
                          "routed experts")
    if (experts + num_redundant) % ep_size:
        raise KernelError(f"EPLB places {experts} experts + {num_redundant} redundant ones evenly on {ep_size} "
                          f"expert-parallel ranks: {experts + num_redundant} is not a multiple of {ep_size} "
                          "(choose num_redundant_experts accordingly)")


def communicator_for(config: Any, device_kind: str) -> tuple[str, str]:
    """The EPLB weight communicator for this device, and why (the user's choice stands if it can run here)."""
    chosen = config.communicator
    if chosen in CUDA_ONLY_COMMUNICATORS:
        raise KernelError(f"eplb_config communicator {chosen!r} needs CUDA; on the kernel's platforms use "
                          f"'torch_nccl' (HCCL on an NPU) or 'torch_gloo' (host-staged), or leave it unset")
    if chosen is not None:
        return chosen, "the communicator given in eplb_config"
    return COMMUNICATOR_FOR.get(device_kind, COMMUNICATOR_FOR["cpu"])


def admit(settings: Any, vllm_config: Any, device_kind: str) -> list[ConfigChange]:
    """Set vLLM's EPLB fields from the plugin's settings (nothing when EPLB is off)."""
    if not settings.enable_eplb:
        if settings.eplb_config:
            raise KernelError(f"eplb_config {settings.eplb_config!r} is given but EPLB is off: set enable_eplb=True "
                              "or drop eplb_config")
        return []
    config, _policy = eplb_config_of(settings.eplb_config)
    check_deployment(vllm_config, config.num_redundant_experts)
    requested_async = config.use_async
    requested_communicator = config.communicator
    config.communicator, communicator_reason = communicator_for(config, device_kind)
    changes = [change(vllm_config, "parallel_config.enable_eplb", True, REFUSED_HERE),
               change(vllm_config, "parallel_config.eplb_config", config, f"eplb_config from the kernel's settings; "
                      f"{REFUSED_HERE}")]
    changes.append(ConfigChange("parallel_config.eplb_config.use_async", True, requested_async,
                                "synchronous rearrangement between steps: vLLM's async EPLB worker needs device "
                                "streams and events (CPU torch events cannot record())"))
    if requested_communicator is None:
        changes.append(ConfigChange("parallel_config.eplb_config.communicator", None, config.communicator,
                                    communicator_reason))
    return [c for c in changes if c is not None]

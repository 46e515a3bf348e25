"""What both kernel platforms do: delegate config fix-ups and backend choice to plugins."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Callable

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.config_changes import change
from ascend_kernel.logs import wire_into_vllm
from ascend_kernel.runner.kernel_runner import LIVE as _LIVE


class KernelPlatformMixin:
    """Mixed in front of a vLLM ``Platform`` subclass."""

    #: the worker class path this platform installs when vLLM's is "auto"
    kernel_worker_cls: str = ""
    #: worker class paths of the base platform that the kernel worker replaces
    replaced_worker_cls: tuple[str, ...] = ("auto",)

    @classmethod
    def kernel_check_and_update_config(cls, vllm_config: Any, base: Callable[[Any], None]) -> None:
        logging_change = wire_into_vllm()  # the kernel's log records (and readable errors) through vLLM's logging
        parallel = vllm_config.parallel_config
        requested = SimpleNamespace(scheduler_config=copy.copy(vllm_config.scheduler_config),
                                    cache_config=copy.copy(vllm_config.cache_config))
        base(vllm_config)
        worker = None
        if parallel.worker_cls in cls.replaced_worker_cls:
            worker = change(vllm_config, "parallel_config.worker_cls", cls.kernel_worker_cls,
                            "the kernel's worker builds the kernel's runner")
        kernel = kernel_mod.activate(vllm_config, configure=True, requested=requested)
        kernel_mod.record_changes(vllm_config, [worker, logging_change])
        kernel.resolve(vllm_config)

    @classmethod
    def is_sleep_mode_available(cls) -> bool:
        """Both kernel workers sleep through the ``ascend_kernel_sleep_mode`` hook (vLLM-CPU's would not)."""
        return True

    @classmethod
    def pre_register_and_update(cls, parser: Any = None) -> None:
        """vLLM's moment for names it must know before its config exists: the plugins register theirs."""
        kernel_mod.pre_register()

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """LoRA's products on the ops seam, leaving base requests of a mixed batch alone (ops/lora_punica.py)."""
        return "ascend_kernel.ops.lora_punica.KernelPunicaWrapper"

    @classmethod
    def get_pass_manager_cls(cls) -> str:
        """vLLM's post-grad pass manager with the ``fusion_pass`` table's passes first (ops/pass_manager.py).

        It goes under vLLM's default ``pass_key`` (inductor's ``post_grad_custom_post_pass``): the kernel
        compiles with inductor itself, so no key of its own is needed (vllm-ascend's own compiler has one).
        """
        return "ascend_kernel.ops.pass_manager.SeamPassManager"

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        """Whether the chosen graph mode captures (False before the kernel has chosen one)."""
        kernel = kernel_mod.current_or_none()
        return kernel is not None and kernel.plan is not None and kernel.plan.graph.supports_static_graph()

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        """The class vLLM wraps captured pieces in: the chosen graph mode's."""
        return kernel_mod.current().plan.graph.static_graph_wrapper_cls()

    @classmethod
    def kernel_attn_backend_cls(cls, selected_backend: Any, selector_config: Any, num_heads: int | None,
                                platform_default: Callable[[], str]) -> str:
        provider = kernel_mod.current().plan.attention_backend
        return provider.backend_class_path(selected_backend, selector_config, num_heads, platform_default)

    @classmethod
    def kernel_mla_prefill_backend_cls(cls, selector_config: Any, platform_default: Callable[[], type]) -> type:
        """Providers may also choose the MLA prefill backend; those that do not keep the platform's."""
        provider = kernel_mod.current().plan.attention_backend
        choose_prefill = getattr(provider, "mla_prefill_backend_cls", None)
        if choose_prefill is None:
            return platform_default()
        return choose_prefill(selector_config, platform_default)

    @classmethod
    def set_additional_forward_context(cls, attn_metadata: Any = None, vllm_config: Any = None,
                                       dp_metadata: Any = None, num_tokens: int | None = None,
                                       num_tokens_across_dp: Any = None, cudagraph_runtime_mode: Any = None,
                                       batch_descriptor: Any = None, ubatch_slices: Any = None,
                                       **kwargs: Any) -> dict[str, Any]:
        """The current step's extras for vLLM's forward context (``ascend_attn_state``, ``moe_comm_method``).

        Runs on every forward pass. The parameters are vLLM's keywords by
        name (a call then fills slots instead of building a dict of them);
        the extras are read from :data:`LIVE`, prebuilt per step, unless the
        model has experts and the MoE method depends on the pass's size.
        """
        outcome = _LIVE.outcome
        extras = outcome.extras
        return extras if extras is not None else outcome.runner.kernel_forward_extras(num_tokens)

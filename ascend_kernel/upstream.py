"""Every private vLLM / torch name the kernel touches, declared in one place.

vLLM and torch promise nothing about names that start with an underscore
(nor about Dynamo's source names or vLLM's error texts). The kernel uses a
few of them where no public API does the job; each one is listed in
:data:`NAMES` (what it is, what the kernel needs it for, the versions it was
checked on, the public alternative if any) and reached through an accessor
below, so an upgrade that moves one fails in one place:
``tests/test_upstream_contract.py`` checks every listed name against the
installed vLLM and torch (that it exists, and a callable's parameters), and
fails when a private vLLM/torch access appears anywhere else in
``ascend_kernel/`` or ``plugins/``.

Three kinds of entries:

* ``accessor``: read or called only through a function or constant of this module;
* ``override``: a private method of a vLLM class that a kernel subclass
  overrides or extends (``def _x`` / ``super()._x``). Those cannot move
  here; they are declared with the kernel class that does it, and their
  signature is checked like any other;
* ``text``: a string of vLLM's or Dynamo's the kernel matches (checked by behaviour).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: F401 - re-exported for the kernel

#: the versions every entry was checked on
CHECKED_ON = {"vllm": "0.32.0", "torch": "2.13.0"}


@dataclass(frozen=True)
class PrivateName:
    """One private name: ``target`` is ``module:qualified.name`` (``module`` alone for a private module)."""

    target: str
    kind: str  # "accessor" | "override" | "text"
    why: str
    public: str = "none"
    #: a callable's parameter names as checked (None: not a callable, or not checked)
    params: tuple[str, ...] | None = None
    #: an instance attribute vLLM sets in ``__init__`` (checked in the class's source, not on the class)
    instance_attribute: bool = False
    #: for overrides: the kernel classes that override or extend it (``module:Class``)
    overridden_by: tuple[str, ...] = ()


#: the methods of vLLM-CPU's punica wrapper the kernel's LoRA wrapper overrides, with the parameters checked
_LORA_OVERRIDES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("_shrink_prefill", ("self", "y", "x", "w_t_all", "scale")),
    ("_shrink_decode", ("self", "y", "x", "w_t_all", "scale")),
    ("_expand_prefill", ("self", "y", "x", "w_t_all", "add_inputs")),
    ("_expand_decode", ("self", "y", "x", "w_t_all", "add_inputs")),
    ("_expand_slice_prefill", None),
    ("_expand_slice_decode", None),
)

NAMES: tuple[PrivateName, ...] = (
    # -- torch -------------------------------------------------------------------------------------------
    PrivateName("torch._C:_len_torch_dispatch_stack", "accessor",
                "seam ops (ascend_kernel/ops/opaque.py) go through the registered op while a TorchDispatchMode "
                "is active (fake tensors, the graph stand-in); read on every seam-op call, so bound directly",
                "none: torch.utils._python_dispatch.is_in_torch_dispatch_mode is itself in a private module and "
                "slower", params=()),
    PrivateName("torch.utils._pytree", "accessor",
                "flatten/unflatten of call arguments and results (graph wrappers, whole-model capture)",
                "none in torch 2.13 (torch.utils.pytree is not public yet)"),
    PrivateName("torch._dynamo.config:recompile_limit", "accessor",
                "cpu-graph compiles one artifact per capture size of the same code object; the limit is raised "
                "inside the capture only (dynamo_config_patch)", "none"),
    PrivateName("torch._dynamo.config:patch", "accessor",
                "scoped Dynamo config changes (restored on exit)", "none", params=("arg1", "arg2", "kwargs")),
    PrivateName("torch._inductor:standalone_compile", "accessor",
                "a static-shape artifact called without Dynamo's guards (cpu-graph)",
                "torch.compile keeps Dynamo's frame hook and guards in every call",
                params=("gm", "example_inputs", "dynamic_shapes", "options", "aot", "donate_graph_module",
                        "fake_mode")),
    PrivateName("torch._inductor.config", "accessor",
                "inductor options the kernel's compiles override, scoped (plugins/graph/inductor_fixups.py)",
                "torch.compile(options=...) where the call is the kernel's"),
    PrivateName("torch.distributed:ProcessGroup._get_backend", "accessor",
                "the HCCL communicator name the MC2 kernels address a group by (ascend_kernel/ops/mc2_npu.py)",
                "none"),
    PrivateName("torch.cpu:_is_amx_tile_supported", "accessor",
                "vLLM-CPU's fused MoE picks AMX tiles for bf16 where the CPU has them; the kernel picks the same",
                "none", params=()),
    # -- vLLM's compiled library -------------------------------------------------------------------------
    PrivateName("vllm._custom_ops", "accessor",
                "importing it loads vLLM-CPU's _C library (torch.ops._C: cpu_fused_moe, prepack_moe_weight, "
                "fused_gumbel_argmax), the CPU kernels the kernel's CPU providers call",
                "none: vLLM's ops have no public Python API"),
    # -- vLLM ----------------------------------------------------------------------------------------------
    PrivateName("argparse:ArgumentParser._actions", "accessor",
                "ascend-kernel serve checks --kv-transfer-config inside vLLM's own parser (its action's type)",
                "none in argparse", instance_attribute=True),
    PrivateName("vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory._registry", "accessor",
                "the connector names vLLM knows, listed in the kernel's config error",
                "none: get_connector_class_by_name only raises for an unknown name"),
    PrivateName("vllm.v1.worker.gpu_model_runner:GPUModelRunner._capture_cudagraphs", "accessor",
                "cpu-graph runs vLLM's per-mode capture loop without capture_model's CUDA stream and memory reads",
                "GPUModelRunner.capture_model (needs CUDA streams and device memory)",
                params=("self", "batch_descriptors", "cudagraph_runtime_mode", "profiler")),
    PrivateName("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector:"
                "MooncakeConnectorWorker._physical_blocks_per_logical_kv_block", "accessor",
                "bytes per logical block for the transfer counts", "none", instance_attribute=True),
    PrivateName("vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner._forward_entry", "accessor",
                "with DP > 1 the moe_comm plugin points each MoE runner at the registered vllm.moe_forward op, as "
                "vLLM selects it off CPU: vLLM-CPU calls the op's body, whose DP gather Dynamo cannot trace",
                "none: MoERunner._select_forward picks by platform only", instance_attribute=True),
    PrivateName("vllm.v1.engine.async_llm:AsyncLLM._run_output_handler", "accessor",
                "the liveness watch fails a client that may not have served a request yet; vLLM's server "
                "watchdog shuts down only a client whose output handler has ended, and starts none itself",
                "none: AsyncLLM.generate starts it with the first request", params=("self",)),
    PrivateName("vllm.v1.worker.gpu_model_runner:GPUModelRunner._moe_model", "accessor",
                "the EPLB plugin gives the CPU runner the MixtureOfExperts model its eplb_step asserts (vLLM's CPU "
                "load_model never sets it)", "none: only GPUModelRunner.load_model sets it", instance_attribute=True),
    PrivateName("vllm.lora.punica_wrapper.punica_base:PunicaWrapperBase._token_lora_indices", "accessor",
                "the kernel's punica wrapper reads each row's adapter slot from this buffer (refreshed in place every "
                "step), cut to the rows of the call, so a traced graph reads the step's indices by address",
                "PunicaWrapperBase.token_lora_indices (cut by a host count a traced graph would keep)",
                instance_attribute=True),
    PrivateName("vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1._vllm_config", "accessor",
                "the connector's config (bootstrap address, kv_role) in the kernel's Mooncake connector", "none",
                instance_attribute=True),
    PrivateName("vllm.model_executor.layers.attention.mla_attention:MLACommonImpl._use_flashinfer_concat_mla_k",
                "accessor", "set by the Ascend MLA impl, which skips MLACommonImpl.__init__ (it picks GPU prefill "
                "kernels); MLACommonImpl reads it in its prefill", "none", instance_attribute=True),
    PrivateName("vllm.logger:_VllmLogRecordFactory._factory", "accessor",
                "the kernel's log records find their own factory inside the one vLLM wraps around it "
                "(ascend_kernel/logs.py)", "none", instance_attribute=True),
    PrivateName("vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding._match_cos_sin_cache_dtype",
                "accessor", "the rotary cache in the query's dtype, as vLLM's own forward paths take it",
                "none", params=("self", "query")),
    PrivateName("vllm.v1.sample.rejection_sampler:RejectionSampler._get_logprobs_tensors", "accessor",
                "the rejection sampler's logprobs, computed as vLLM computes them", "none",
                params=("self", "max_num_logprobs", "metadata", "logits", "target_logits", "bonus_logits",
                        "sampled_token_ids")),
    # -- overrides of vLLM's private methods ----------------------------------------------------------
    PrivateName("vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs", "override",
                "the runner core's step seam: the kernel decides the step's attention state before vLLM's inputs",
                "none (Model Runner V2's pluggable design is not in 0.32 on CPU)",
                params=("self", "scheduler_output", "num_scheduled_tokens"),
                overridden_by=("ascend_kernel.runner.kernel_runner:KernelRunnerMixin",)),
    PrivateName("vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample", "override",
                "the kernel's sampler and rejection sampler", "none",
                params=("self", "logits", "spec_decode_metadata"),
                overridden_by=("ascend_kernel.runner.kernel_runner:KernelRunnerMixin",)),
    PrivateName("vllm.v1.worker.gpu_model_runner:GPUModelRunner._dummy_run", "override",
                "the idle step state around vLLM's dummy runs", "none",
                overridden_by=("ascend_kernel.runner.kernel_runner:KernelRunnerMixin",)),
    PrivateName("vllm.v1.worker.gpu_worker:Worker._maybe_get_memory_pool_context", "override",
                "no CUDA/XPU sleep allocator around the weights' and KV cache's allocation: the sleep-mode plugin "
                "frees storages by tag (vLLM's raises on an NPU)", "none", params=("self", "tag"),
                overridden_by=("ascend_kernel.worker.sleep:KernelSleepMixin",)),
    PrivateName("vllm.v1.executor.ray_executor_v2:RayExecutorV2._init_executor", "override",
                "Ray workers of the CPU platform (the worker-actor class during start-up)", "none",
                params=("self",), overridden_by=("ascend_kernel.platform.ray_executor:KernelCpuRayExecutor",)),
    PrivateName("vllm.v1.executor.ray_executor_v2:RayExecutorV2._build_runtime_env", "override",
                "ASCEND_KERNEL_* variables reach the Ray workers", "none", params=("self",),
                overridden_by=("ascend_kernel.platform.ray_executor:KernelCpuRayExecutor",)),
    PrivateName("vllm.v1.executor.ray_executor_v2:RayExecutorV2._get_actor_resource_kwargs", "override",
                "a CPU worker actor's resources (Ray forbids CPU in resources=)", "none", params=(),
                overridden_by=("ascend_kernel.platform.ray_executor:KernelCpuRayExecutor",)),
    PrivateName("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector:"
                "MooncakeConnectorWorker._send_blocks", "override", "count the bytes a producer sent", "none",
                params=("self", "remote_session", "src_ptrs", "dst_ptrs", "lengths"),
                overridden_by=("ascend_kernel_plugins.kv_transfer.mooncake:KernelMooncakeWorker",)),
    PrivateName("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector:"
                "MooncakeConnectorWorker._handle_failed_recv", "override",
                "count failed pulls; the bounded pull fails its requests the way vLLM fails any pull", "none",
                params=("self", "pull_metas", "req_ids", "reason"),
                overridden_by=("ascend_kernel_plugins.kv_transfer.mooncake:KernelMooncakeWorker",)),
    *(PrivateName(f"vllm.lora.punica_wrapper.punica_cpu:PunicaWrapperCPU.{method}", "override",
                  "the LoRA products on the ops seam: rows without an adapter (index -1) keep the base output "
                  "(vLLM's torch ops read slot -1)", "none: the CPU wrapper's public methods call these",
                  params=params, overridden_by=("ascend_kernel.ops.lora_punica:KernelPunicaWrapper",))
      for method, params in _LORA_OVERRIDES),
    # -- texts ------------------------------------------------------------------------------------------
    PrivateName("torch._dynamo:source name L['self'] / placeholder l_self_", "text",
                "whole-model capture tells the model's own tensors from the call's by Dynamo's source names "
                "(the graph argument's meta['grapharg'].source, else the placeholder name derived from it)",
                "none: Dynamo's graph-argument sources are internal"),
    PrivateName("vllm.v1.serial_utils:run_method message", "text",
                "the report route answers 404 only when the workers lack the kernel's RPC (vLLM's text for a "
                "missing method), 500 otherwise", "none: vLLM reports a utility failure as a plain Exception"),
)


def entry(target: str) -> PrivateName:
    """The declared entry for ``target`` (KeyError names the known ones)."""
    for name in NAMES:
        if name.target == target:
            return name
    raise KeyError(f"{target!r} is not declared in ascend_kernel.upstream.NAMES")


# =====================================================================================================
# torch
# =====================================================================================================

#: > 0 while a TorchDispatchMode is active; called on every seam-op call, so the C function itself
dispatch_mode_depth: Callable[[], int] = torch._C._len_torch_dispatch_stack

#: how Dynamo names the traced frame's argument ``self`` in a graph argument's source, and the placeholder
#: name it derives from that source (torch 2.13 hands backends placeholders without the source in ``meta``)
DYNAMO_SELF_SOURCE = "L['self']"
DYNAMO_SELF_PLACEHOLDER = "l_self_"


def dynamo_reached_from_self(node: Any) -> bool:
    """Whether Dynamo found this placeholder's value through the traced frame's ``self`` (attribute chains,
    closures included): by its recorded source where the graph keeps one, else by the name derived from it."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is not None:
        return source.name().startswith(DYNAMO_SELF_SOURCE)
    return node.name.startswith(DYNAMO_SELF_PLACEHOLDER)


def dynamo_recompile_limit() -> int:
    import torch._dynamo

    return torch._dynamo.config.recompile_limit


@contextlib.contextmanager
def dynamo_config_patch(**changes: Any) -> Iterator[None]:
    """Dynamo config ``changes`` inside the block only (restored on exit, also on error)."""
    import torch._dynamo

    with torch._dynamo.config.patch(**changes):
        yield


def standalone_compile() -> Callable[..., Any]:
    """inductor's ``standalone_compile`` (imported on first use: inductor is slow to import)."""
    from torch._inductor import standalone_compile as compile_

    return compile_


def inductor_config() -> Any:
    import torch._inductor.config as config

    return config


def process_group_backend(group: Any, device: torch.device) -> Any:
    return group._get_backend(device)


def cpu_has_amx_tiles() -> bool:
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


# =====================================================================================================
# vLLM
# =====================================================================================================


def vllm_c_ops(load: bool = True) -> Any:
    """vLLM's compiled op namespace ``torch.ops._C`` (importing ``vllm._custom_ops`` first loads the library)."""
    if load:
        import vllm._custom_ops  # noqa: F401
    return torch.ops._C


def parser_action(parser: Any, dest: str) -> Any:
    """The argparse action of ``parser`` that stores ``dest`` (StopIteration if none)."""
    return next(a for a in parser._actions if a.dest == dest)


def kv_connector_names() -> list[str]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return sorted(KVConnectorFactory._registry)


def capture_cudagraphs(runner: Any, descriptors: Any, runtime_mode: Any) -> Any:
    """vLLM's capture loop for one runtime mode over its dispatcher's descriptors."""
    return runner._capture_cudagraphs(descriptors, cudagraph_runtime_mode=runtime_mode)


def mooncake_blocks_per_logical_block(worker: Any) -> int:
    return worker._physical_blocks_per_logical_kv_block


def lora_token_indices(wrapper: Any) -> torch.Tensor:
    """The punica wrapper's per-token slot buffer (``-1``: no adapter), all of it."""
    return wrapper._token_lora_indices


def connector_vllm_config(connector: Any) -> Any:
    return connector._vllm_config


def mla_impl_defaults(impl: Any) -> None:
    """The private attributes ``MLACommonImpl.__init__`` would set, for an impl that does not call it."""
    impl._use_flashinfer_concat_mla_k = False


def wrapped_record_factory(factory: Any) -> Any:
    """The factory a vLLM log-record factory wraps (None for any other factory)."""
    return getattr(factory, "_factory", None)


def rotary_cache_for(layer: Any, query: torch.Tensor) -> torch.Tensor:
    return layer._match_cos_sin_cache_dtype(query)


def rejection_logprobs(sampler: Any, *args: Any) -> Any:
    return sampler._get_logprobs_tensors(*args)


def missing_worker_method(name: str) -> str:
    """vLLM's text when a worker has no method ``name`` (``collective_rpc`` of a string)."""
    return f"Method {name!r} is not implemented."


def moe_runner_entry(runner: Any) -> Any:
    """What a vLLM MoE runner's ``forward`` calls: the op's Python body or the registered op."""
    return runner._forward_entry


def set_moe_runner_entry(runner: Any, entry: Any) -> None:
    runner._forward_entry = entry


def start_output_handler(engine_client: Any) -> None:
    """Start vLLM's output handler of an ``AsyncLLM`` (a no-op where it runs already)."""
    engine_client._run_output_handler()


def set_runner_moe_model(runner: Any, model: Any) -> None:
    """The MoE model vLLM's ``eplb_step`` steps (set by GPU ``load_model`` only)."""
    runner._moe_model = model


# =====================================================================================================
# torch_npu and vLLM-Ascend's extension: the vendor stack's private names (kept as one block: issue 41)
# =====================================================================================================


@dataclass(frozen=True)
class VendorName:
    """One private name of torch_npu or of vLLM-Ascend's ``_C_ascend`` ops, with the schema the kernel calls it by.

    ``target`` is ``module:name`` (``torch_npu:_npu_paged_attention``,
    ``torch_npu._C:_weak_ref_tensor``, ``torch.ops._C_ascend:bgmv_shrink``);
    ``params`` the parameter names in order (the kernel passes the ``_npu_*``
    kernels keywords, so a renamed parameter is drift). No torch_npu here:
    ``tests/npu/test_vendor_contract.py`` checks every call the kernel makes
    against these schemas, and against the installed torch_npu where there is one.
    """

    target: str
    params: tuple[str, ...]
    why: str


_PA = ("query", "key_cache", "value_cache", "num_kv_heads", "num_heads", "scale_value", "block_table",
       "context_lens", "out")
_QLENS = ("query", "key_cache", "value_cache", "block_table", "mask", "seq_len", "context_lens", "num_kv_heads",
          "num_heads", "scale_value", "out")
VENDOR_NAMES: tuple[VendorName, ...] = (
    VendorName("torch_npu:_npu_reshape_and_cache", ("key", "value", "key_cache", "value_cache", "slot_indices"),
               "KV cache writes (ops/npu.py reshape_and_cache), as vllm-ascend's attention"),
    VendorName("torch_npu:_npu_flash_attention", ("query", "key", "value", "mask", "seq_len", "scale_value",
                                                  "num_heads", "num_kv_heads", "out"), "prefill attention"),
    VendorName("torch_npu:_npu_paged_attention", (*_PA, "workspace"), "decode attention (workspace: in graphs)"),
    VendorName("torch_npu:_npu_paged_attention_get_workspace", _PA, "the decode workspace a captured graph keeps"),
    VendorName("torch_npu:_npu_paged_attention_splitfuse", ("query", "key_cache", "value_cache", "mask",
                                                            "block_table", "seq_len", "context_lens", "num_kv_heads",
                                                            "num_heads", "scale_value", "out"), "chunked prefill"),
    VendorName("torch_npu:_npu_flash_attention_qlens", _QLENS, "prefill with a prefix cache"),
    VendorName("torch_npu:_npu_paged_attention_mla", ("query", "key_cache", "num_kv_heads", "num_heads",
                                                      "scale_value", "block_table", "context_lens", "mla_vheadsize",
                                                      "out"), "MLA decode"),
    VendorName("torch_npu:_npu_rotary_embedding", ("positions", "query", "key", "head_size", "cos_sin_cache",
                                                   "is_neox_style"), "in-place rotary embedding"),
    VendorName("torch_npu._C:_weak_ref_tensor", ("tensor",), "graph outputs that do not keep the pool's memory "
                                                            "alive (device.py weak_ref)"),
    # the fused matmul-collective kernels (ops/matmul_comm_npu.py): op-plugin's schemas name the first input
    # ``self`` (reduce-scatter) and ``input`` (all-gather); the kernel passes the first four by position
    VendorName("torch_npu:npu_mm_reduce_scatter_base", ("self", "x2", "hcom", "world_size", "reduce_op", "bias",
                                                         "comm_turn"),
               "a row-parallel matmul fused with the reduce-scatter of sequence parallelism, as vllm-ascend's"),
    VendorName("torch_npu:npu_all_gather_base_mm", ("input", "x2", "hcom", "world_size", "bias", "gather_index",
                                                     "gather_output", "comm_turn"),
               "the all-gather of sequence parallelism fused with a column-parallel matmul"),
    VendorName("torch.ops._C_ascend:bgmv_shrink", ("x", "weight", "indices", "y", "scale"), "LoRA shrink"),
    VendorName("torch.ops._C_ascend:bgmv_expand", ("x", "weight", "indices", "y", "slice_offset", "slice_size"),
               "LoRA expand"),
    VendorName("torch.ops._C_ascend:sgmv_shrink", ("x", "weight", "lora_indices", "seq_len", "y", "scale"),
               "LoRA shrink by sequence"),
    VendorName("torch.ops._C_ascend:sgmv_expand", ("x", "weight", "lora_indices", "seq_len", "y", "slice_offset",
                                                   "slice_size"), "LoRA expand by sequence"),
)


def vendor_name(target: str) -> VendorName:
    """The declared vendor name ``target`` (KeyError names the known ones)."""
    for name in VENDOR_NAMES:
        if name.target == target:
            return name
    raise KeyError(f"{target!r} is not declared in ascend_kernel.upstream.VENDOR_NAMES; known: "
                   f"{[n.target for n in VENDOR_NAMES]}")

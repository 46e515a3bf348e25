"""Graph modes: what is captured, how, and which captured size a batch runs at.

``eager`` captures nothing (the only mode on a host without graphs, and what
``enforce_eager`` asks for). ``aclgraph`` resolves the vLLM compilation config
the way Ascend needs it (piecewise by default, full-decode-only when asked,
no inductor) and captures through vLLM's own capture loop into
:class:`~ascend_kernel_plugins.graph.acl_wrapper.AclGraphWrapper`, whose graph
objects come from the device seam.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from ascend_kernel.config_changes import ConfigChange, change

#: Ascend caps the default largest capture size (graph memory grows with it)
MAX_DEFAULT_CAPTURE_SIZE = 512


class EagerMode:
    __slots__ = ()

    def supports_static_graph(self) -> bool:
        return False

    def static_graph_wrapper_cls(self) -> str:
        return "vllm.compilation.base_static_graph.AbstractStaticGraphWrapper"

    def describe(self) -> dict[str, Any]:
        return {"mode": "eager", "sizes": [], "captured_sizes": [], "capture_s": 0.0, "replays": {},
                "eager_fallbacks": 0, "why": "no capture: every step runs eagerly"}

    def capture_sizes(self, vllm_config: Any) -> list[int]:
        return []

    def capture(self, runner: Any, base_capture: Callable[[], int]) -> int:
        return 0

    def padded_num_tokens(self, num_tokens: int) -> int:
        return num_tokens


class AclGraphMode:
    __slots__ = ("sizes",)

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sorted(sizes)

    @classmethod
    def from_context(cls, ctx: Any) -> "AclGraphMode":
        return cls(list(ctx.vllm_config.compilation_config.cudagraph_capture_sizes or []))

    def capture_sizes(self, vllm_config: Any) -> list[int]:
        return list(self.sizes)

    def supports_static_graph(self) -> bool:
        return True

    def static_graph_wrapper_cls(self) -> str:
        """The ACL graph wrapper: vLLM's wrapper contract, graphs from the device seam (not yet run on an NPU)."""
        return "ascend_kernel_plugins.graph.acl_wrapper.AclGraphWrapper"

    def capture(self, runner: Any, base_capture: Callable[[], int]) -> int:
        return base_capture()

    def wrap_model(self, model: Any, vllm_config: Any) -> Any:
        """FULL / FULL_DECODE_ONLY: the whole model in ACL graphs (vLLM's runner would use CUDA graphs)."""
        from ascend_kernel_plugins.graph.full_graph import wrap_whole_model

        return wrap_whole_model(model, vllm_config, self.static_graph_wrapper_cls())

    def describe(self) -> dict[str, Any]:
        return {"mode": "aclgraph", "sizes": list(self.sizes), "why": "ACL graphs at the configured sizes"}

    def padded_num_tokens(self, num_tokens: int) -> int:
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else num_tokens


def default_max_capture_size(vllm_config: Any) -> int | None:
    """max_num_seqs x decode query length, capped at 512; None when the user set sizes."""
    comp = vllm_config.compilation_config
    if comp.max_cudagraph_capture_size is not None or comp.cudagraph_capture_sizes is not None:
        return None
    spec = vllm_config.speculative_config
    decode_len = 1 + (spec.num_speculative_tokens if spec is not None and spec.num_speculative_tokens else 0)
    return min(vllm_config.scheduler_config.max_num_seqs * decode_len, MAX_DEFAULT_CAPTURE_SIZE)


def resolve_npu_graph_config(vllm_config: Any, capture_mode: str = "auto") -> list[ConfigChange]:
    """Ascend's graph-mode rules applied to a vLLM config (NPU only).

    ``capture_mode`` is the ``graph_capture_mode`` setting: ``auto`` keeps
    vLLM's ``cudagraph_mode``; a name sets it first, then the rules apply.
    """
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    comp = vllm_config.compilation_config
    model = vllm_config.model_config
    changes: list[ConfigChange | None] = []
    if capture_mode != "auto" and not (model is not None and model.enforce_eager):
        changes.append(change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode[capture_mode.upper()],
                              f"graph_capture_mode={capture_mode}"))
    if model is not None and model.enforce_eager:
        changes.append(change(vllm_config, "compilation_config.mode", CompilationMode.NONE, "enforce_eager"))
        changes.append(change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.NONE, "enforce_eager"))
        return [c for c in changes if c]
    if comp.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE:
        changes.append(change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.PIECEWISE,
                              "full-and-piecewise graphs are not supported on NPU yet"))
    if model is not None and model.is_encoder_decoder:
        changes.append(change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.PIECEWISE,
                              "encoder-decoder models support piecewise graphs only"))
    mode = comp.cudagraph_mode
    if mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.FULL_DECODE_ONLY):
        changes.append(change(vllm_config, "compilation_config.backend", "eager",
                              "ACL graphs replay captured NPU ops; inductor is not used on NPU"))
        if mode != CUDAGraphMode.PIECEWISE:
            changes.append(change(vllm_config, "compilation_config.splitting_ops", [],
                                  "full graphs are captured unsplit"))
    elif mode != CUDAGraphMode.NONE:
        changes.append(change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.NONE,
                              f"{mode} is not supported on NPU"))
    if comp.cudagraph_mode == CUDAGraphMode.NONE:
        changes.append(change(vllm_config, "compilation_config.mode", CompilationMode.NONE, "no graphs on NPU"))
    return [c for c in changes if c]


def capture_refusal(ctx: Any, device_kind: str, wrong_device: str) -> str | None:
    """Why a capturing mode cannot serve this engine (wrong device, or the user asked for eager), else None."""
    if ctx.device.kind != device_kind:
        return f"{wrong_device} (device is {ctx.device.kind})"
    model = ctx.vllm_config.model_config
    if model is not None and model.enforce_eager:
        return "enforce_eager is set"
    return None


def aclgraph_supported(ctx: Any) -> str | None:
    return capture_refusal(ctx, "npu", "ACL graphs need an NPU")

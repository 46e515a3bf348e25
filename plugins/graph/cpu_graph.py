"""The ``cpu-graph`` mode: vLLM's capture loop and dispatcher, with a static-shape artifact per size.

vLLM-CPU never captures: its platform forces ``cudagraph_mode=NONE`` and its
worker never calls ``capture_model``. This mode turns that back on through
vLLM's own machinery, in either of vLLM's two capture modes:

* ``piecewise`` (default): piecewise compilation splits the model at
  attention and each piece is wrapped in :class:`StaticShapeWrapper` (the
  platform's static graph wrapper class, which the kernel platform takes from
  the chosen mode); every batch up to the largest size is padded and replayed.
* ``full_decode_only``: the whole model is wrapped (see
  :mod:`~ascend_kernel_plugins.graph.full_graph`) and a uniform decode batch
  replays one artifact with attention inside (as an opaque op); prefills and
  mixed batches run the model eagerly. vLLM only dispatches full graphs to
  attention backends that declare full-graph support: the Ascend backends
  declare it on a CPU, and the kernel hands out vLLM's CPU attention under a
  subclass that does (see ``attention/cpu_full_graph.py``).

Either way vLLM's ``CudagraphDispatcher`` pads a batch up to the next captured
size (and runs eagerly above the largest), and vLLM's ``_capture_cudagraphs``
drives one dummy pass per size at start-up, in which each wrapper compiles
its artifact.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable

from ascend_kernel.config_changes import ConfigChange, change

NAME = "cpu-graph"
#: capture sizes when the user names none: each size costs one compile per piece at start-up
DEFAULT_SIZES = (1, 2, 4, 8)
WRAPPER_CLS = "ascend_kernel_plugins.graph.static_wrapper.StaticShapeWrapper"
CAPTURE_MODES = ("piecewise", "full_decode_only")
FULL_WHY = ("full_decode_only (uniform decode batches replay the whole model, attention inside; "
            "prefills and mixed batches run eagerly)")


def chosen_capture_mode(settings: Any) -> str:
    """``graph_capture_mode`` as cpu-graph runs it: ``auto`` is piecewise."""
    mode = settings.graph_capture_mode
    return "piecewise" if mode == "auto" else mode


class CpuGraphMode:
    """Captures one static artifact per size and piece; the report says what ran."""

    __slots__ = ("sizes", "capture_s", "why", "capture_mode")

    def __init__(self, sizes: list[int], why: str, capture_mode: str = "piecewise") -> None:
        self.sizes = sorted(sizes)
        self.capture_s = 0.0
        self.why = why
        self.capture_mode = capture_mode

    @classmethod
    def from_context(cls, ctx: Any) -> "CpuGraphMode":
        sizes = list(ctx.vllm_config.compilation_config.cudagraph_capture_sizes or [])
        given = ctx.settings.graph_capture_sizes
        why = (f"sizes {sizes} from graph_capture_sizes" if given else f"default sizes {sizes}")
        capture_mode = chosen_capture_mode(ctx.settings)
        how = (FULL_WHY if capture_mode == "full_decode_only" else "piecewise (attention runs between captured pieces)")
        return cls(sizes, f"{why}; {how}", capture_mode)

    # -- the platform's static-graph questions --------------------------------
    def supports_static_graph(self) -> bool:
        return True

    def static_graph_wrapper_cls(self) -> str:
        return WRAPPER_CLS

    # -- the family's interface ----------------------------------------------
    def capture_sizes(self, vllm_config: Any) -> list[int]:
        return list(self.sizes)

    def wrap_model(self, model: Any, vllm_config: Any) -> Any:
        """full_decode_only: the whole model in the static wrapper (piecewise wraps vLLM's pieces instead)."""
        from ascend_kernel_plugins.graph.full_graph import wrap_whole_model

        return wrap_whole_model(model, vllm_config, WRAPPER_CLS)

    def capture(self, runner: Any, base_capture: Callable[[], int]) -> int:
        """vLLM's per-mode capture loop (``_capture_cudagraphs``) over its dispatcher's descriptors.

        vLLM's ``capture_model`` around it is not used: it opens CUDA streams
        and reads device memory, which a CPU has neither of.
        """
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled

        from ascend_kernel.upstream import capture_cudagraphs
        from ascend_kernel_plugins.graph.static_wrapper import BOOK

        resolved = runner.compilation_config.cudagraph_mode
        if resolved is None or resolved.name == "NONE":
            from ascend_kernel.errors import SelectionError

            raise SelectionError(
                f"cpu-graph ({self.capture_mode}) was chosen, but vLLM turned graph capture off for this model "
                "(its log says why: an attention backend without full-graph support, or a feature that excludes "
                "graphs); nothing would be captured. Use graph_capture_mode=piecewise or graph_mode=eager.")
        started = time.perf_counter()
        set_cudagraph_capturing_enabled(True)
        try:
            for runtime_mode, descriptors in runner.cudagraph_dispatcher.get_capture_descs():
                capture_cudagraphs(runner, descriptors, runtime_mode)
        finally:
            set_cudagraph_capturing_enabled(False)
        self.capture_s = time.perf_counter() - started
        BOOK.serving = True
        return 0

    def padded_num_tokens(self, num_tokens: int) -> int:
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else num_tokens

    def describe(self) -> dict[str, Any]:
        from ascend_kernel_plugins.graph.static_wrapper import BOOK

        book = BOOK.as_dict()
        return {"mode": NAME, "capture_mode": self.capture_mode, "sizes": list(self.sizes),
                "capture_s": round(self.capture_s, 3), "why": self.why, **book}


def cpu_graph_supported(ctx: Any) -> str | None:
    from ascend_kernel_plugins.graph.modes import capture_refusal

    refusal = capture_refusal(ctx, "cpu", "cpu-graph is the host fallback of graph capture; on an NPU use aclgraph")
    if refusal is not None:
        return refusal
    comp = ctx.vllm_config.compilation_config
    if not comp.cudagraph_capture_sizes:
        return "no capture sizes are configured"
    model = ctx.vllm_config.model_config
    if model is not None and getattr(model, "use_mla", False) and _cpu_attention(ctx) != "ascend":
        # vLLM-CPU's MLA backend writes the padded batch's latents against the real tokens' slots
        return ("vLLM-CPU's MLA backend cannot take a batch padded to a capture size (its KV-cache write "
                "fails on the padding rows); with cpu-graph, MLA models need the Ascend backend "
                "(ASCEND_KERNEL_ATTENTION_BACKEND=ascend)")
    return None


def _cpu_attention(ctx: Any) -> str:
    """The attention backend a CPU host will run (sparse models get the Ascend one unforced)."""
    from ascend_kernel_plugins.attention import cpu_backend_choice

    return cpu_backend_choice(ctx.settings.attention_backend, ctx.vllm_config)


def resolve_cpu_graph_config(vllm_config: Any, sizes: list[int] | None,
                             capture_mode: str = "piecewise") -> list[ConfigChange]:
    """vLLM's config as cpu-graph needs it: graphs on, the capture mode, the capture sizes.

    Runs after vLLM's CPU platform has turned compilation to trace-once and
    graphs off. ``piecewise``: vLLM's piecewise compilation (it splits the
    model at attention after the platform hook). ``full_decode_only``: no vLLM
    compilation at all (prefills run the plain model; the whole-model wrapper
    compiles its own artifact per decode size, and a Dynamo trace of vLLM's
    around it would only be traced through).
    """
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    model = vllm_config.model_config
    if model is not None and model.enforce_eager:
        return []  # the mode's support check refuses it, naming enforce_eager
    limit = vllm_config.scheduler_config.max_num_batched_tokens
    chosen = [s for s in (sizes or DEFAULT_SIZES) if s <= limit]
    source = "graph_capture_sizes" if sizes else f"cpu-graph's default {list(DEFAULT_SIZES)}"
    full = capture_mode == "full_decode_only"
    if full:
        mode_changes = [
            change(vllm_config, "compilation_config.mode", CompilationMode.NONE,
                   "cpu-graph full_decode_only: the whole-model wrapper compiles one artifact per decode size; "
                   "prefills run the model eagerly"),
            change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.FULL_DECODE_ONLY,
                   "cpu-graph full_decode_only: uniform decode batches replay the whole model"),
        ]
    else:
        mode_changes = [
            change(vllm_config, "compilation_config.mode", CompilationMode.VLLM_COMPILE,
                   "cpu-graph captures the pieces of vLLM's piecewise compilation"),
            change(vllm_config, "compilation_config.backend", "eager",
                   "pieces run as traced FX graphs; each capture size gets its own static inductor artifact"),
            change(vllm_config, "compilation_config.cudagraph_mode", CUDAGraphMode.PIECEWISE,
                   "cpu-graph: attention runs between captured pieces"),
        ]
    comp = vllm_config.compilation_config
    changes = [
        *mode_changes,
        change(vllm_config, "compilation_config.cudagraph_capture_sizes", chosen,
               f"from {source} (<= max_num_batched_tokens {limit})"),
        change(vllm_config, "compilation_config.max_cudagraph_capture_size", max(chosen, default=0),
               "the largest capture size; larger batches run eagerly"),
    ]
    comp.post_init_cudagraph_sizes()
    if not full:
        changes.append(_no_aot_compile())
    return [c for c in changes if c]


def _no_aot_compile() -> ConfigChange | None:
    """Turn vLLM's AOT compile off for this process (and the engine processes it starts), unless the user chose.

    With the ``eager`` compile backend vLLM skips AOT compilation but, while
    ``VLLM_USE_AOT_COMPILE`` is on (its default on torch >= 2.10), it still
    hashes the whole config on every forward pass before finding the compiled
    model (measured: ~10 ms of a 5 ms tiny-model step). The variable is vLLM's
    own knob; the change is recorded like any other.
    """
    import os

    if "VLLM_USE_AOT_COMPILE" in os.environ:
        return None
    os.environ["VLLM_USE_AOT_COMPILE"] = "0"
    return ConfigChange("env.VLLM_USE_AOT_COMPILE", "(unset: on)", "0",
                        "the eager compile backend does no AOT compile, yet with it on vLLM hashes the config "
                        "on every forward pass")

"""Inductor options every compile the kernel drives runs with: the peak-memory reorder is off.

Why: on torch 2.13 inductor's peak-memory pass (``reorder_for_peak_memory``)
can move a kernel that *reads* a buffer ahead of the extern op that *writes*
it, when that op returns nothing and mutates its first argument. vLLM-CPU's
linear layers are such ops (``_C::onednn_mm(Tensor(a!) c, ...) -> ()``, into a
fresh ``torch.empty``). Measured here on the tiny DeepSeek-V3 (sigmoid
grouped top-k routing): the router's sigmoid was scheduled before the gate's
matmul wrote its output, so routing read uninitialised memory and greedy
tokens left transformers' from the first decode step; with the pass off they
are exact, under vLLM's default compilation and the kernel's cpu-graph
artifacts alike. The pass only reorders for memory (the generated compute is
the same), so turning it off costs at most a higher peak of activations.

Stock vLLM-CPU runs the same pass; whether a model trips it depends on the
order the pass picks, so the kernel does not wait for a model to show it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ascend_kernel.config_changes import ConfigChange, change

#: inductor options (``torch._inductor.config`` names) the kernel's compiles override, with the value
OVERRIDES: dict[str, Any] = {"reorder_for_peak_memory": False}
REASON = ("inductor's peak-memory reorder can run a read before an extern op's write into the buffer "
          "(vLLM-CPU's onednn_mm): wrong tokens on DeepSeek-V3 routing")
PASSES_REASON = ("the seam's fusion passes (family fusion_pass) as inductor's post-grad custom pass: this compile "
                 "does not go through vLLM's backend, whose pass manager would run them")


def kernel_options(with_passes: bool = True) -> dict[str, Any]:
    """:data:`OVERRIDES`, and the seam's fusion passes as inductor's post-grad custom pass.

    The passes (:mod:`ascend_kernel.ops.pass_manager`) are what the platform's
    pass manager runs under vLLM's own backend; a compile that does not go
    through that backend gets them here, in its own options only.
    """
    if not with_passes:
        return dict(OVERRIDES)
    from ascend_kernel.ops.pass_manager import POST_GRAD_KEY, SeamFusionPasses

    return {**OVERRIDES, POST_GRAD_KEY: SeamFusionPasses()}


def compilation_fixups(vllm_config: Any) -> list[ConfigChange]:
    """vLLM's own compilation (Dynamo once, then inductor) gets :func:`kernel_options` in its inductor options.

    Nothing changes when vLLM does not compile, or compiles with another
    backend. Under ``VLLM_COMPILE`` vLLM's backend runs the platform's pass
    manager (which holds the fusion passes), so only :data:`OVERRIDES` go in;
    a post-grad pass the user set stays theirs.
    """
    from vllm.config import CompilationMode

    compilation = getattr(vllm_config, "compilation_config", None)
    if compilation is None or compilation.mode == CompilationMode.NONE or compilation.backend != "inductor":
        return []
    options = dict(compilation.inductor_compile_config)
    ours = kernel_options(with_passes=compilation.mode != CompilationMode.VLLM_COMPILE)
    added = {k: v for k, v in ours.items() if k not in options}
    if not added:
        return []  # set already (by the user, whose value stands, or by an earlier pass)
    why = "; ".join(REASON if k in OVERRIDES else PASSES_REASON for k in added)
    updated = change(vllm_config, "compilation_config.inductor_compile_config", {**options, **added}, why)
    return [updated] if updated is not None else []


@contextlib.contextmanager
def kernel_inductor_options() -> Iterator[None]:
    """Inductor's config with :func:`kernel_options`, around a compile the kernel runs itself (cpu-graph artifacts)."""
    from ascend_kernel.upstream import inductor_config

    with inductor_config().patch(kernel_options()):
        yield

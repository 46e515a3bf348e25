"""A third-party ascend-kernel plugin used by the tests: a sampler named ``demo-greedy``.

Put ``tests/thirdparty`` on ``sys.path`` (or ``PYTHONPATH``): the neighbouring
``ak_demo_plugin-1.0.dist-info`` declares the entry point
``[ascend_kernel.plugins] demo = ak_demo_plugin``, so the kernel discovers it like
any installed plugin. Its sampler outranks the built-in ``vllm-default``
(priority 50 > 0) and is vLLM's own ``Sampler`` with a class-level call counter
(``DemoSampler.calls``), so a test can prove the kernel really used it.
"""

from __future__ import annotations

import functools
from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

PLUGIN_NAME = "demo"
SAMPLER_NAME = "demo-greedy"
PRIORITY = 50


@functools.cache
def _demo_sampler_class() -> type:
    """DemoSampler, defined on first use so that vLLM is imported only by ``build``."""
    from vllm.v1.sample.sampler import Sampler

    class DemoSampler(Sampler):
        """vLLM's Sampler, unchanged, counting its calls in ``DemoSampler.calls``."""

        calls = 0

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            DemoSampler.calls += 1
            return super().forward(*args, **kwargs)

    DemoSampler.__module__ = __name__
    DemoSampler.__qualname__ = "DemoSampler"
    return DemoSampler


def __getattr__(name: str) -> Any:
    # ``ak_demo_plugin.DemoSampler`` imports vLLM lazily (not listed by dir(),
    # so pluggy's scan of the module never triggers it).
    if name == "DemoSampler":
        return _demo_sampler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DemoSamplerBuilder:
    """What the kernel holds for the ``sampler`` family: ``build(vllm_config) -> sampler``."""

    __slots__ = ()

    def build(self, vllm_config: Any) -> Any:
        model = vllm_config.model_config
        return _demo_sampler_class()(
            logprobs_mode=model.logprobs_mode, use_fp64_gumbel=model.use_fp64_gumbel
        )


def _factory(ctx: Any) -> DemoSamplerBuilder:
    return DemoSamplerBuilder()


@hookimpl
def ascend_kernel_samplers() -> list[Implementation]:
    return [
        Implementation(
            family="sampler",
            name=SAMPLER_NAME,
            factory=_factory,
            priority=PRIORITY,
            description="vLLM's Sampler with a call counter (third-party demo plugin)",
        )
    ]

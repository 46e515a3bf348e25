"""A deliberately broken third-party plugin: the conformance kit must fail it, naming each broken contract.

Kept in ``tests/thirdparty/broken`` (not ``tests/thirdparty``), so that only
the tests that put this folder on ``sys.path`` ever see it; the neighbouring
``ak_broken_plugin-1.0.dist-info`` declares ``[ascend_kernel.plugins] broken =
ak_broken_plugin``. Both entries have the lowest priority, so even when
installed they are never chosen unless forced.

* sampler ``off-by-one``: returns argmax + 1 (modulo the vocabulary) for
  every row, and no logprobs: breaks ``greedy-argmax``, ``top-k`` (a top-1 row)
  and ``logprobs``, while its ids stay valid (``token-ids`` passes);
* graph mode ``shrinking``: pads a batch of ``n`` tokens to ``n - 1``: breaks
  ``pads-monotonically``.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

PLUGIN_NAME = "broken"
SAMPLER_NAME = "off-by-one"
GRAPH_NAME = "shrinking"


class OffByOneSampler(torch.nn.Module):
    def forward(self, logits: torch.Tensor, sampling_metadata: Any, **_: Any) -> Any:
        from vllm.v1.outputs import SamplerOutput

        ids = (logits.argmax(dim=-1) + 1) % logits.shape[-1]
        return SamplerOutput(sampled_token_ids=ids.to(torch.int32).unsqueeze(1), logprobs_tensors=None)


class OffByOneBuilder:
    def build(self, vllm_config: Any) -> OffByOneSampler:
        return OffByOneSampler()


class ShrinkingGraphMode:
    def capture_sizes(self, vllm_config: Any) -> list[int]:
        return [1, 2, 4]

    def capture(self, runner: Any, base_capture: Any = None) -> int:
        return 0

    def padded_num_tokens(self, num_tokens: int) -> int:
        return max(1, num_tokens - 1)

    def supports_static_graph(self) -> bool:
        return False

    def static_graph_wrapper_cls(self) -> str:
        return "vllm.compilation.base_static_graph.AbstractStaticGraphWrapper"


@hookimpl
def ascend_kernel_samplers() -> list[Implementation]:
    return [Implementation(family="sampler", name=SAMPLER_NAME, factory=lambda ctx: OffByOneBuilder(),
                           priority=-100, description="argmax + 1: deliberately wrong")]


@hookimpl
def ascend_kernel_graph_modes() -> list[Implementation]:
    return [Implementation(family="graph", name=GRAPH_NAME, factory=lambda ctx: ShrinkingGraphMode(),
                           priority=-100, description="pads n tokens to n - 1: deliberately wrong")]

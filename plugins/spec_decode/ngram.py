"""The n-gram drafter: proposes continuations found earlier in the same sequence.

It needs no model, no KV cache and no device kernels, so it runs the same on
every host; vLLM's ``NgramProposer`` (numba, CPU) does the matching.
Verification batches run the SpecDecoding kernel.

Under full decode graphs (``FULL_DECODE_ONLY``, or any mode whose decode
routine is FULL) vLLM replays a captured graph only for *uniform* batches:
every request verifies ``1 + k`` tokens. The n-gram matcher proposes fewer
(or none) wherever the context has no match, so without help almost no
verification batch replays. There the drafter pads every proposal to ``k``
tokens (:class:`UniformNgramProposer`), repeating the last proposed token, or
the last sampled one when nothing matched. Padding changes what is verified,
never what is generated: a drafted token is kept only if the target itself
would have produced it (greedy), and rejection sampling keeps the target's
distribution for any proposal, deterministic ones included. It costs the
verification of tokens that are rarely accepted, which a replayed graph
(launch-bound decode on an NPU) more than pays for.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import KernelDrafter


def pad_proposals(drafts: list[list[int]], sampled_token_ids: list[list[int]], num_tokens: Any, k: int,
                  max_model_len: int) -> list[list[int]]:
    """Every request that drafts at all gets ``k`` tokens (fewer only where ``max_model_len`` leaves less room).

    A request that vLLM's matcher skipped (nothing sampled this step, or at the
    length limit) keeps its empty proposal, as vLLM would schedule it.
    """
    padded = []
    for i, draft in enumerate(drafts):
        sampled = sampled_token_ids[i]
        room = min(k, max_model_len - int(num_tokens[i]))
        if not sampled or room <= len(draft):
            padded.append(list(draft))
            continue
        filler = draft[-1] if draft else sampled[-1]
        padded.append([*draft, *([filler] * (room - len(draft)))])
    return padded


def _uniform_proposer_cls() -> type:
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    class UniformNgramProposer(NgramProposer):
        """vLLM's n-gram proposer whose proposals all have ``num_speculative_tokens`` tokens."""

        def propose(self, num_speculative_tokens: int, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                    token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
            drafts = super().propose(num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                     slot_mappings)
            return pad_proposals(drafts, sampled_token_ids, num_tokens_no_spec, num_speculative_tokens,
                                 self.max_model_len)

    return UniformNgramProposer


def full_decode_graphs(vllm_config: Any) -> bool:
    """Decode batches are replayed as full graphs (vLLM dispatches them only when uniform)."""
    from vllm.config import CUDAGraphMode

    mode = vllm_config.compilation_config.cudagraph_mode
    return mode is not None and mode.decode_mode() == CUDAGraphMode.FULL


class NgramDrafter(KernelDrafter):
    methods = frozenset({"ngram"})

    def __init__(self) -> None:
        self.uniform = False

    def build(self, runner: Any) -> Any:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        self.uniform = full_decode_graphs(runner.vllm_config)
        cls = _uniform_proposer_cls() if self.uniform else NgramProposer
        return cls(runner.vllm_config)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "uniform_proposals": self.uniform}


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [Implementation(family="drafter", name="ngram", factory=lambda ctx: NgramDrafter(),
                           supports=NgramDrafter.supports, priority=10,
                           description="prompt-lookup n-gram drafting (CPU, model-free); proposals padded to k "
                           "under full decode graphs, so verification batches replay")]

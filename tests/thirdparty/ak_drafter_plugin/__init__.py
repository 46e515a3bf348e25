"""Third-party drafters under method names vLLM does not know: ``oracle`` and ``contrarian``.

One file and one entry point (``ak_drafter_plugin-1.0.dist-info`` beside it;
put ``tests/thirdparty`` on ``PYTHONPATH``). vLLM validates
``speculative_config.method`` against its own list before any platform hook
sees the config, so a new method reaches the runner through vLLM's
``custom_class`` method: ``{"method": "custom_class", "model":
"ak_drafter_plugin.OracleProposer", "num_speculative_tokens": 3}``. The
kernel's drafter family then picks this plugin's entry by that class path
(its ``supports``), the entry builds the proposer, and the decision record
names the plugin.

``oracle`` proposes the known greedy continuation of each request, read from
the JSON file named by ``AK_DRAFTER_ORACLE`` (a list of
``{"prompt_token_ids": [...], "token_ids": [...]}``, e.g. transformers'
greedy output): every draft is right. ``contrarian`` proposes the token after
each right one (id + 1): every draft is wrong. Speculation must not change the
output either way.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation


class OracleProposer:
    """Proposes the next ``num_speculative_tokens`` tokens of the known continuation."""

    shift = 0

    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.vocab = vllm_config.model_config.get_vocab_size()
        with open(os.environ["AK_DRAFTER_ORACLE"]) as f:
            self.sequences = [entry["prompt_token_ids"] + entry["token_ids"] for entry in json.load(f)]

    def continuation(self, seen: list[int]) -> list[int]:
        for full in self.sequences:
            if len(full) > len(seen) and full[: len(seen)] == seen:
                return full[len(seen): len(seen) + self.k]
        return []

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        drafts = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # the request sampled nothing this step (a prompt chunk): no draft
                drafts.append([])
                continue
            seen = token_ids_cpu[i, : int(num_tokens_no_spec[i])].tolist()
            drafts.append([(t + self.shift) % self.vocab for t in self.continuation(seen)])
        return drafts

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Model-free: nothing to load."""


class ContrarianProposer(OracleProposer):
    shift = 1


class CustomClassDrafter:
    """The kernel-side entry: builds this plugin's proposer, declares its needs."""

    single_token_state = "DecodeOnly"
    verify_state = "SpecDecoding"
    kv_cache = "none"

    def __init__(self, proposer_cls: type) -> None:
        self.proposer_cls = proposer_cls

    def build(self, runner: Any) -> Any:
        return self.proposer_cls(runner.vllm_config)

    def describe(self) -> dict[str, Any]:
        return {"class": self.proposer_cls.__name__, "methods": ["custom_class"], "kv_cache": self.kv_cache,
                "single_token_state": self.single_token_state, "verify_state": self.verify_state}


def _serves(proposer_cls: type):
    path = f"{__name__}.{proposer_cls.__name__}"

    def supports(ctx: Any) -> str | None:
        spec = ctx.vllm_config.speculative_config
        if spec is None or spec.method != "custom_class" or spec.model != path:
            return f"speculative_config is not {{'method': 'custom_class', 'model': '{path}'}}"
        return None

    return supports


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [
        Implementation(family="drafter", name=name, factory=lambda ctx, cls=cls: CustomClassDrafter(cls),
                       supports=_serves(cls), priority=20, description=description)
        for name, cls, description in (
            ("oracle", OracleProposer, "proposes the known continuation (every draft accepted)"),
            ("contrarian", ContrarianProposer, "proposes a wrong token at every position (none accepted)"),
        )
    ]

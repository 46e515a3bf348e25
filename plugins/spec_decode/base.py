"""What a drafter plugin's object is: the proposer it builds, and what it asks of the rest of the kernel.

A drafter owns three decisions the Ascend runner used to make with
``if method == ...`` branches:

* **the proposer** (``build(runner)``): the object vLLM's runner keeps as
  ``runner.drafter`` and calls through its speculative-method dispatch
  (``propose(...)``, ``load_model(...)``); a plugin may use vLLM's proposer
  classes as the base, as Ascend's do;
* **the attention state of the target's batches** while it speculates
  (``single_token_state``, ``verify_state``: names of
  :class:`ascend_kernel.step.AttentionState`), read by the
  attention-state policy, so that no attention code knows drafter methods;
* **its KV-cache needs** (``kv_cache``): none for model-free drafters, its own
  layers' caches (allocated by the kernel's layouts like the target's) for
  drafters with a model.
"""

from __future__ import annotations

from typing import Any, ClassVar


class KernelDrafter:
    """Base of the built-in drafters."""

    #: speculative methods (vLLM's ``speculative_config.method``) this drafter serves
    methods: ClassVar[frozenset[str]] = frozenset()
    single_token_state: ClassVar[str] = "DecodeOnly"
    verify_state: ClassVar[str] = "SpecDecoding"
    kv_cache: ClassVar[str] = "none"

    def build(self, runner: Any) -> Any:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "methods": sorted(self.methods),
                "single_token_state": self.single_token_state, "verify_state": self.verify_state,
                "kv_cache": self.kv_cache}

    @classmethod
    def supports(cls, ctx: Any) -> str | None:
        spec = ctx.vllm_config.speculative_config
        if spec is None:
            return "no speculative decoding configured"
        if spec.method not in cls.methods:
            return f"speculative method is {spec.method!r}, not one of {', '.join(sorted(cls.methods))}"
        return None


class HiddenStateDrafter(KernelDrafter):
    """Drafters whose proposer drafts from the target's hidden states: vLLM's ``EagleProposer`` (EAGLE, MTP)."""

    def build(self, runner: Any) -> Any:
        from vllm.v1.spec_decode.eagle import EagleProposer

        return EagleProposer(runner.vllm_config, runner.device, runner)

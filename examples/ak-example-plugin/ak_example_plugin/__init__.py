"""ak-example-plugin: registers the attention-state policy ``coarse`` (see README.md for its rule)."""

from __future__ import annotations

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

POLICY_NAME = "coarse"
#: below the built-in policy (0): chosen only when forced (ASCEND_KERNEL_ATTENTION_STATE=coarse)
PRIORITY = -50


@hookimpl
def ascend_kernel_attention_state_policies() -> list[Implementation]:
    return [
        Implementation(
            family="attention_state",
            name=POLICY_NAME,
            factory="ak_example_plugin.policy:CoarseStatePolicy.from_context",
            priority=PRIORITY,
            description="three states: Prefill, Decode, Verify (prompts vs one-token decodes vs draft verification)",
        )
    ]

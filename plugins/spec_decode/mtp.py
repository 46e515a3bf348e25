"""MTP: the model's own next-token-prediction layers (DeepSeek's ``num_nextn_predict_layers``) draft.

The MTP layers get KV caches like the target's (an MLA model's MTP layer is
MLA too); MTP verifies with the SpecDecoding kernel, one-token decodes
included (under PD disaggregation a decode arrives with no draft yet), as the
Ascend runner does. The proposer is vLLM's ``EagleProposer``, which serves
MTP in vLLM 0.32.
"""

from __future__ import annotations

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation
from ascend_kernel_plugins.spec_decode.base import HiddenStateDrafter


class MtpDrafter(HiddenStateDrafter):
    methods = frozenset({"mtp", "deepseek_mtp"})
    single_token_state = "SpecDecoding"
    kv_cache = "the MTP layers' attention caches (kernel layouts, separate KV groups)"


@hookimpl
def ascend_kernel_drafters() -> list[Implementation]:
    return [Implementation(family="drafter", name="mtp", factory=lambda ctx: MtpDrafter(),
                           supports=MtpDrafter.supports, priority=10,
                           description="the model's next-token-prediction layers (DeepSeek MTP)")]

"""The runner binds KV caches in vLLM's layer order without knowing model types."""

from __future__ import annotations

import pytest
from vllm.model_executor.models.utils import extract_layer_index

from ascend_kernel.runner.kernel_runner import attn_modules_per_layer

PLAIN = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
# LongCat-Flash: two MLA modules per decoder layer (self_attn is a ModuleList)
TWO_PER_LAYER = [f"model.layers.{i}.self_attn.{j}.attn" for i in range(3) for j in range(2)]
WITH_DRAFT = PLAIN + ["draft_model.model.layers.4.self_attn.attn"]


@pytest.mark.parametrize("names, expected", [(PLAIN, 1), (TWO_PER_LAYER, 2), (WITH_DRAFT, 1), ([], 1)])
def test_modules_per_layer_from_names(names, expected):
    assert attn_modules_per_layer(names) == expected


@pytest.mark.parametrize("names", [PLAIN, TWO_PER_LAYER, WITH_DRAFT])
def test_vllm_orders_every_layer_apart_with_the_derived_count(names):
    """vLLM's own index function, given the count, puts every KV layer at its own position, in model order."""
    count = attn_modules_per_layer(names)
    indices = [extract_layer_index(name, count) for name in names]
    assert len(set(indices)) == len(names)
    assert indices == sorted(indices)


def test_the_model_type_rule_vllm_uses_agrees_for_longcat():
    """vLLM's runner passes 2 for model_type longcat_flash: the names give the same number."""
    assert attn_modules_per_layer(TWO_PER_LAYER) == 2
    with pytest.raises(AssertionError):  # and 1 would be refused by vLLM for such names
        extract_layer_index(TWO_PER_LAYER[0], 1)

"""Attention masks against independently built oracles, and the cache's growth."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ascend_kernel_plugins.attention.masks import CACHE_HIT_MASK_SIZE, AttentionMaskBuilder, masked_value
from ascend_kernel_plugins.attention.states import AttentionState

CPU = torch.device("cpu")
DTYPES = [(torch.float16, float("-inf")), (torch.float32, 1.0), (torch.bfloat16, 1.0)]


def oracle(size: int, dtype: torch.dtype, value: float) -> torch.Tensor:
    """Masked (j > i) cells hold ``value``, the rest 0, built with torch.triu."""
    keep = torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=1)
    return torch.where(keep, torch.tensor(value, dtype=dtype), torch.tensor(0.0, dtype=dtype))


def oracle_rows(positions: list[int], width: int, dtype: torch.dtype, value: float) -> torch.Tensor:
    rows = [[value if j > p else 0.0 for j in range(width)] for p in positions]
    return torch.tensor(rows, dtype=dtype)


def test_oracle_sanity():
    o = oracle(3, torch.float32, 1.0)
    assert o.tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize(("dtype", "value"), DTYPES)
def test_masked_value(dtype, value):
    assert masked_value(dtype) == value


@pytest.mark.parametrize(("dtype", "value"), DTYPES)
@pytest.mark.parametrize("size", [1, 2, 7, 64, 129])
def test_causal_equals_oracle(dtype, value, size):
    mask = AttentionMaskBuilder().causal(size, dtype, CPU)
    assert mask.dtype == dtype and mask.shape == (size, size)
    assert torch.equal(mask, oracle(size, dtype, value))


@pytest.mark.parametrize(("dtype", "value"), DTYPES)
def test_causal_slices_of_a_grown_cache_equal_oracle(dtype, value):
    b = AttentionMaskBuilder()
    for size in (3, 50, 17, 100, 1, 33):
        assert torch.equal(b.causal(size, dtype, CPU), oracle(size, dtype, value)), size


def _capacity(mask: torch.Tensor) -> int:
    """Side length of the cached square the returned slice is a view of."""
    elements = mask.untyped_storage().nbytes() // mask.element_size()
    side = int(round(elements ** 0.5))
    assert side * side == elements
    return side


def test_cache_grows_by_doubling_and_is_not_rebuilt_for_smaller():
    b = AttentionMaskBuilder()
    assert b.builds == 0
    m = b.causal(4, torch.float16, CPU)
    assert b.builds == 1 and _capacity(m) == 4
    for size in (1, 2, 3, 4):
        m = b.causal(size, torch.float16, CPU)
    assert b.builds == 1 and _capacity(m) == 4
    m = b.causal(5, torch.float16, CPU)  # grows to twice the old capacity
    assert b.builds == 2 and _capacity(m) == 8
    b.causal(8, torch.float16, CPU)
    b.causal(6, torch.float16, CPU)
    assert b.builds == 2
    m = b.causal(40, torch.float16, CPU)  # more than double asked: exactly what is asked
    assert b.builds == 3 and _capacity(m) == 40
    m = b.causal(41, torch.float16, CPU)
    assert b.builds == 4 and _capacity(m) == 80
    assert torch.equal(m, oracle(41, torch.float16, float("-inf")))


def test_cache_is_per_dtype():
    b = AttentionMaskBuilder()
    half = b.causal(8, torch.float16, CPU)
    single = b.causal(8, torch.float32, CPU)
    assert b.builds == 2
    assert half.dtype == torch.float16 and single.dtype == torch.float32
    b.causal(4, torch.float16, CPU)
    b.causal(4, torch.float32, CPU)
    assert b.builds == 2


def test_repeated_requests_return_views_of_one_buffer():
    b = AttentionMaskBuilder()
    first = b.causal(16, torch.float32, CPU)
    second = b.causal(16, torch.float32, CPU)
    assert first.data_ptr() == second.data_ptr()


@pytest.mark.parametrize(("dtype", "value"), DTYPES)
def test_splitfuse_rows_equal_oracle(dtype, value):
    b = AttentionMaskBuilder()
    # request 0: 3 new tokens at positions 4..6 of a 7-token sequence;
    # request 1: a fresh 5-token prefill; request 2: one decode token at position 2
    seq_lens = torch.tensor([7, 5, 3])
    positions = [4, 5, 6, 0, 1, 2, 3, 4, 2]
    mask = b.splitfuse(seq_lens, torch.tensor(positions, dtype=torch.int32), dtype, CPU)
    assert mask.shape == (len(positions), 7)
    assert torch.equal(mask, oracle_rows(positions, 7, dtype, value))


def test_splitfuse_uses_the_cache():
    b = AttentionMaskBuilder()
    b.causal(64, torch.float16, CPU)
    mask = b.splitfuse(torch.tensor([10]), torch.tensor([9, 0]), torch.float16, CPU)
    assert b.builds == 1
    assert torch.equal(mask, oracle_rows([9, 0], 10, torch.float16, float("-inf")))


SEQ_LENS = torch.tensor([6, 3])
POSITIONS = torch.tensor([3, 4, 5, 2])


@pytest.mark.parametrize("state", [AttentionState.DecodeOnly, AttentionState.SpecDecoding])
def test_mask_for_decode_states_is_none(state):
    b = AttentionMaskBuilder()
    assert b.mask_for(state, SEQ_LENS, POSITIONS, torch.float16, CPU) is None
    assert b.builds == 0


@pytest.mark.parametrize(("dtype", "value"), DTYPES)
def test_mask_for_prefill_states(dtype, value):
    b = AttentionMaskBuilder()
    no_cache = b.mask_for(AttentionState.PrefillNoCache, SEQ_LENS, POSITIONS, dtype, CPU)
    assert torch.equal(no_cache, oracle(6, dtype, value))
    hit = b.mask_for(AttentionState.PrefillCacheHit, SEQ_LENS, POSITIONS, dtype, CPU)
    assert hit.shape == (CACHE_HIT_MASK_SIZE, CACHE_HIT_MASK_SIZE) == (128, 128)
    assert torch.equal(hit, oracle(128, dtype, value))
    chunked = b.mask_for(AttentionState.ChunkedPrefill, SEQ_LENS, POSITIONS, dtype, CPU)
    assert torch.equal(chunked, oracle_rows(POSITIONS.tolist(), 6, dtype, value))


@pytest.mark.parametrize("state", list(AttentionState))
def test_pooling_mask_is_all_zeros(state):
    b = AttentionMaskBuilder(pooling_cls=True)
    mask = b.mask_for(state, SEQ_LENS, POSITIONS, torch.float16, CPU)
    assert mask.shape == (6, 6) and mask.dtype == torch.float16
    assert torch.count_nonzero(mask) == 0


def _ctx(runner_type, pooler_config):
    return SimpleNamespace(vllm_config=SimpleNamespace(
        model_config=SimpleNamespace(runner_type=runner_type, pooler_config=pooler_config)))


@pytest.mark.parametrize(
    ("runner_type", "pooler", "expected"),
    [
        ("pooling", SimpleNamespace(pooling_type="CLS"), True),
        ("pooling", SimpleNamespace(pooling_type="cls"), True),
        ("pooling", SimpleNamespace(pooling_type=None, seq_pooling_type="CLS"), True),
        ("pooling", SimpleNamespace(pooling_type="MEAN"), False),
        ("pooling", None, False),
        ("generate", SimpleNamespace(pooling_type="CLS"), False),
        ("generate", None, False),
    ],
)
def test_from_context_pooling_cls(runner_type, pooler, expected):
    assert AttentionMaskBuilder.from_context(_ctx(runner_type, pooler)).pooling_cls is expected

"""The per-step attention state: Ascend's rules as a truth table."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ascend_kernel.step import StepBatch
from ascend_kernel_plugins.attention.states import AttentionState, StandardStatePolicy
from ascend_kernel_plugins.spec_decode.draft_model import DraftModelDrafter
from ascend_kernel_plugins.spec_decode.eagle import EagleDrafter
from ascend_kernel_plugins.spec_decode.mtp import MtpDrafter
from ascend_kernel_plugins.spec_decode.ngram import NgramDrafter

#: the drafter each speculative method's plugin builds: it declares the states of its verification batches
DRAFTERS = {None: None, "ngram": NgramDrafter(), "draft_model": DraftModelDrafter(), "eagle": EagleDrafter(),
            "eagle3": EagleDrafter(), "mtp": MtpDrafter(), "deepseek_mtp": MtpDrafter()}


def make_policy(method, chunked):
    ctx = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked)),
                          chosen={"drafter": DRAFTERS[method]})
    return StandardStatePolicy.from_context(ctx)

S = AttentionState


def batch(seq_lens, scheduled, valid=None, num_reqs=None, pad=0):
    """StepBatch from per-request lists; ``pad`` appends garbage rows beyond num_reqs."""
    valid = scheduled if valid is None else valid
    n = len(seq_lens) if num_reqs is None else num_reqs
    junk = [7] * pad
    return StepBatch(
        num_reqs=n,
        seq_lens=np.array(list(seq_lens) + junk, dtype=np.int32),
        num_scheduled_tokens=np.array(list(scheduled) + [3] * pad, dtype=np.int32),
        num_valid_tokens=np.array(list(valid) + [2] * pad, dtype=np.int32),
        total_tokens=int(sum(scheduled[:n])),
    )


ALL_PREFILL = dict(seq_lens=[5, 9], scheduled=[5, 9])
ALL_DECODE = dict(seq_lens=[6, 10, 3], scheduled=[1, 1, 1])
SPEC_VERIFY = dict(seq_lens=[8, 12], scheduled=[3, 3], valid=[1, 1])
SPEC_VERIFY_UNEVEN = dict(seq_lens=[8, 12], scheduled=[3, 1], valid=[1, 1])
MIXED = dict(seq_lens=[5, 20], scheduled=[5, 1])  # one fresh prefill + one decode
PARTIAL_PREFILL = dict(seq_lens=[40], scheduled=[16])  # chunk of a longer prompt (or prefix hit)
MIXED_SPEC = dict(seq_lens=[8, 30], scheduled=[3, 10], valid=[1, 10])

TABLE = [
    # (case id, batch, spec_method, chunked_prefill, expected)
    ("prefill", ALL_PREFILL, None, True, S.PrefillNoCache),
    ("prefill-no-chunk", ALL_PREFILL, None, False, S.PrefillNoCache),
    ("prefill-mtp", ALL_PREFILL, "mtp", True, S.PrefillNoCache),
    ("prefill-eagle", ALL_PREFILL, "eagle", True, S.PrefillNoCache),
    ("decode", ALL_DECODE, None, True, S.DecodeOnly),
    ("decode-no-chunk", ALL_DECODE, None, False, S.DecodeOnly),
    ("decode-ngram", ALL_DECODE, "ngram", True, S.DecodeOnly),
    ("decode-eagle", ALL_DECODE, "eagle", True, S.DecodeOnly),
    ("decode-mtp", ALL_DECODE, "mtp", True, S.SpecDecoding),
    ("decode-deepseek-mtp", ALL_DECODE, "deepseek_mtp", False, S.SpecDecoding),
    ("verify-ngram", SPEC_VERIFY, "ngram", True, S.SpecDecoding),
    ("verify-mtp", SPEC_VERIFY, "mtp", True, S.SpecDecoding),
    ("verify-uneven", SPEC_VERIFY_UNEVEN, "ngram", False, S.SpecDecoding),
    ("verify-eagle", SPEC_VERIFY, "eagle", True, S.ChunkedPrefill),
    ("verify-eagle3", SPEC_VERIFY, "eagle3", False, S.ChunkedPrefill),
    ("verify-draft-model", SPEC_VERIFY, "draft_model", True, S.SpecDecoding),
    ("decode-draft-model", ALL_DECODE, "draft_model", True, S.DecodeOnly),
    ("mixed-chunked", MIXED, None, True, S.ChunkedPrefill),
    ("mixed-not-chunked", MIXED, None, False, S.PrefillCacheHit),
    ("partial-chunked", PARTIAL_PREFILL, None, True, S.ChunkedPrefill),
    ("partial-not-chunked", PARTIAL_PREFILL, None, False, S.PrefillCacheHit),
    ("mixed-spec-chunked", MIXED_SPEC, "ngram", True, S.ChunkedPrefill),
    ("mixed-spec-not-chunked", MIXED_SPEC, "eagle", False, S.PrefillCacheHit),
    ("mixed-mtp-not-chunked", MIXED, "mtp", False, S.PrefillCacheHit),
]


@pytest.mark.parametrize(("spec", "method", "chunked", "expected"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_truth_table(spec, method, chunked, expected):
    assert make_policy(method, chunked).decide(batch(**spec)) is expected


@pytest.mark.parametrize(("spec", "method", "chunked", "expected"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_rows_beyond_num_reqs_are_ignored(spec, method, chunked, expected):
    """Padding rows (stale data past num_reqs) would change every answer if they counted."""
    assert make_policy(method, chunked).decide(batch(**spec, pad=4)) is expected


def test_only_first_num_reqs_count_explicitly():
    # request 0 is a one-token decode; request 1 (outside num_reqs) is a prefill
    b = batch(seq_lens=[10, 4], scheduled=[1, 4], num_reqs=1)
    assert StandardStatePolicy(True).decide(b) is S.DecodeOnly
    b = batch(seq_lens=[10, 4], scheduled=[1, 4], num_reqs=2)
    assert StandardStatePolicy(True).decide(b) is S.ChunkedPrefill


@pytest.mark.parametrize(
    ("state", "is_prefill"),
    [(S.PrefillNoCache, True), (S.PrefillCacheHit, True), (S.ChunkedPrefill, True),
     (S.DecodeOnly, False), (S.SpecDecoding, False)],
)
def test_is_prefill(state, is_prefill):
    assert state.is_prefill is is_prefill


@pytest.mark.parametrize(
    ("method", "chunked", "single", "verify"),
    [(None, True, S.DecodeOnly, S.SpecDecoding), ("eagle3", False, S.DecodeOnly, S.ChunkedPrefill),
     ("mtp", 1, S.SpecDecoding, S.SpecDecoding), ("ngram", 0, S.DecodeOnly, S.SpecDecoding)],
)
def test_from_context_reads_the_drafters_rule_once(method, chunked, single, verify):
    policy = make_policy(method, chunked)
    assert (policy.single_token_state, policy.verify_state) == (single, verify)
    assert policy.chunked_prefill is bool(chunked)
    assert not hasattr(policy, "__dict__")  # slotted: nothing but the three facts

"""The n-gram drafter's padding for full decode graphs: every drafting request proposes exactly k tokens."""

from __future__ import annotations

import numpy as np

from ascend_kernel_plugins.spec_decode.ngram import pad_proposals


def test_short_and_empty_proposals_are_padded_to_k():
    drafts = [[7, 8], [], [5, 6, 9]]
    sampled = [[3], [4], [1]]
    got = pad_proposals(drafts, sampled, np.array([10, 10, 10]), k=3, max_model_len=100)
    # the last proposed token repeats; with no match, the last sampled token does
    assert got == [[7, 8, 8], [4, 4, 4], [5, 6, 9]]
    assert drafts == [[7, 8], [], [5, 6, 9]]  # the matcher's lists are not changed in place


def test_requests_vllm_skips_stay_empty_and_the_length_limit_holds():
    drafts = [[], [], [2]]
    sampled = [[], [4], [3]]  # request 0 sampled nothing this step (vLLM does not draft for it)
    got = pad_proposals(drafts, sampled, np.array([10, 100, 98]), k=3, max_model_len=100)
    assert got == [[], [], [2, 2]]  # request 1 is at max_model_len; request 2 has room for 2


def test_the_uniform_proposer_is_chosen_only_under_full_decode_graphs():
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    from ascend_kernel_plugins.spec_decode.ngram import full_decode_graphs

    def config(mode):
        return SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_mode=mode))

    assert full_decode_graphs(config(CUDAGraphMode.FULL_DECODE_ONLY))
    assert full_decode_graphs(config(CUDAGraphMode.FULL_AND_PIECEWISE))
    assert full_decode_graphs(config(CUDAGraphMode.FULL))
    assert not full_decode_graphs(config(CUDAGraphMode.PIECEWISE))
    assert not full_decode_graphs(config(CUDAGraphMode.NONE))

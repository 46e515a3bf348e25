"""lm-head tensor parallelism under pure DP: the vllm-ascend keys, the refusals, the sizes, and two gloo ranks.

The two-rank runs build the plugin's sharded head and logits processor (the
classes vLLM would instantiate under the setting) over a gloo group, load the
full checkpoint weight through vLLM's weight loader, and compare each rank's
logits with vLLM's own ``LogitsProcessor`` on an unsharded ``ParallelLMHead``
holding the whole weight (the oracle), for uneven token counts, one rank idle.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ascend_kernel.errors import KernelError, SettingsError
from ascend_kernel.ops.lm_head_tp import collective_bytes
from ascend_kernel.settings import ENV_PREFIX, load_settings
from ascend_kernel_plugins.layers.lm_head_config import check, head_report, problems
from ascend_kernel_plugins.layers.settings import LayersSettings
from ascend_kernel_plugins.vllm_ascend_keys import plugin
from tests.gloo_ranks import run_ranks

WORLD, VOCAB, HIDDEN = 2, 100, 16  # the vocabulary pads to 128 rows: 64 a rank, the second rank's last 28 zero
SOFT_CAP, SCALE = 3.0, 0.5
#: tokens on (rank 0, rank 1) per pass: uneven, one rank idle, both idle
PASSES = [(3, 5), (4, 0), (0, 2), (0, 0), (1, 1)]
DECLARED = [("vllm-ascend-keys", plugin.VllmAscendKeysSettings), ("layers", LayersSettings)]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith((ENV_PREFIX, "VLLM_ASCEND_")):
            monkeypatch.delenv(key)


# -- the keys -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [{"finegrained_tp_config": {"lmhead_tensor_parallel_size": 2}},
                                    {"lmhead_tensor_parallel_size": 2}, {"lmhead_tp_size": "2"}])
def test_vllm_ascends_keys_map_onto_the_setting(config):
    assert load_settings(config, declared=DECLARED).lmhead_tensor_parallel_size == 2


def test_the_setting_is_off_by_default_and_read_from_the_environment(monkeypatch):
    assert load_settings({}, declared=DECLARED).lmhead_tensor_parallel_size is None
    monkeypatch.setenv("ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE", "4")
    assert load_settings({}, declared=DECLARED).lmhead_tensor_parallel_size == 4


@pytest.mark.parametrize("value", [-1, True, "two", 1.5])
def test_a_bad_size_is_refused_naming_the_key_and_what_is_allowed(value):
    """(0 is vllm-ascend's default and means off: tests/test_vllm_ascend_keys.py.)"""
    with pytest.raises(SettingsError) as info:
        load_settings({"finegrained_tp_config": {"lmhead_tensor_parallel_size": value}}, declared=DECLARED)
    message = str(info.value)
    assert 'additional_config["finegrained_tp_config"]["lmhead_tensor_parallel_size"]' in message
    assert "a whole number >= 1 dividing the DP size" in message


def test_an_environment_size_below_one_is_a_settings_error(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE", "0")
    with pytest.raises(SettingsError, match="LMHEAD_TENSOR_PARALLEL_SIZE"):
        load_settings({}, declared=DECLARED)


def test_without_the_layers_plugin_the_key_is_refused_when_on_and_honored_when_off():
    without = DECLARED[:1]
    with pytest.raises(SettingsError, match="no installed plugin implements lm-head tensor parallelism"):
        load_settings({"lmhead_tp_size": 2}, declared=without)
    load_settings({"lmhead_tp_size": None}, declared=without)


# -- where it applies ---------------------------------------------------------------------------------------------


def _config(tp=1, dp=2, pp=1, moe=True, tied=False, vocab=VOCAB, drafter=None):
    text = SimpleNamespace(tie_word_embeddings=tied)
    model = SimpleNamespace(is_moe=moe, hf_text_config=text, get_vocab_size=lambda: vocab)
    return SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=tp, data_parallel_size=dp,
                                                           pipeline_parallel_size=pp), model_config=model,
                           speculative_config=drafter)


@pytest.mark.parametrize(("size", "change", "words"), [
    (2, dict(tp=2), "tensor parallelism 2: lm-head TP is for pure data parallelism"),
    (2, dict(dp=3), "2 does not divide the data-parallel size 3"),
    (4, dict(dp=2), "the lm-head group (4) is larger than the data-parallel size (2)"),
    (2, dict(moe=False), "a dense model: lm-head TP applies to MoE models"),
    (2, dict(pp=2), "pipeline parallelism 2"),
    (2, dict(tied=True), "tied word embeddings"),
    (2, dict(drafter=SimpleNamespace(method="ngram")), "speculative decoding"),
    (3, dict(dp=3), "the padded vocabulary (128 rows) does not split into 3 equal shards"),
])
def test_where_it_cannot_apply_start_up_stops_naming_the_key_and_the_reason(size, change, words):
    with pytest.raises(KernelError) as info:
        check(SimpleNamespace(lmhead_tensor_parallel_size=size), _config(**change))
    message = str(info.value)
    assert words in message and "ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE" in message
    assert "finegrained_tp_config.lmhead_tensor_parallel_size" in message


def test_it_applies_to_an_moe_model_under_pure_dp_and_off_is_never_refused():
    assert problems(2, _config()) == [] and problems(4, _config(dp=8)) == []
    for off in (None, 1):  # off: any configuration, a dense TP=2 model included
        check(SimpleNamespace(lmhead_tensor_parallel_size=off), _config(tp=2, dp=1, moe=False, tied=True))


def test_deepseek_r1s_head_halves_at_two_ranks():
    full, half = head_report(129_280, 7_168, 1, 2), head_report(129_280, 7_168, 2, 2)
    assert full == {"tp_size": 1, "vocab_per_rank": 129_280, "bytes": 1_853_358_080}
    assert half == {"tp_size": 2, "vocab_per_rank": 64_640, "bytes": 926_679_040}
    # a decode step of 1 token a rank receives one hidden row and one logits block of the other rank's shard
    assert collective_bytes(1, 7_168, 64_640, 2, 2, 4) == 7_168 * 2 + 64_640 * 4


# -- two gloo ranks -----------------------------------------------------------------------------------------------


def _worker(rank: int, port: int, out_dir: str) -> None:
    """The plugin's head over a 2-rank gloo group vs vLLM's unsharded head, pass by pass."""
    import torch.distributed as dist
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from ascend_kernel_plugins.layers import lm_head_tp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    weight, bias = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB)
    hidden = {p: torch.randn(sum(PASSES[p]), HIDDEN) for p in range(len(PASSES))}
    # the group this rank's head is built over, as lm_head_group makes it from the DP ranks
    lm_head_tp._GROUPS[id(dist.group.WORLD)] = lm_head_tp.LmHeadGroup([0, 1], rank, dist.group.WORLD)
    lm_head_tp._SIZE["size"] = WORLD
    with set_current_vllm_config(VllmConfig()):
        ours = lm_head_tp.LmHeadTpParallelLMHead(VOCAB, HIDDEN, bias=True)
        full = ParallelLMHead(VOCAB, HIDDEN, bias=True, disable_tp=True)
        processor = lm_head_tp.LmHeadTpLogitsProcessor(VOCAB, soft_cap=SOFT_CAP, scale=SCALE)
        oracle = LogitsProcessor(VOCAB, soft_cap=SOFT_CAP, scale=SCALE)
    for head in (ours, full):
        head.weight_loader(head.weight, weight)
        head.weight_loader(head.bias, bias)
        head.quant_method.process_weights_after_loading(head)  # as vLLM's model loader does (CPU: its GEMM)
    results = []
    for p, counts in enumerate(PASSES):
        start = sum(counts[:rank])
        mine = hidden[p][start:start + counts[rank]]
        got = processor(ours, mine, embedding_bias=ours.bias)
        expected = oracle(full, mine, embedding_bias=full.bias)
        results.append((got, expected))
    # a request asking for prompt logprobs on rank 0 only (its runner's dict): refused before any collective, so
    # the next pass of both ranks still pairs up (had the refused call started one, this would hang or mix)
    processor.prompt_logprobs = {"req-7": 1} if rank == 0 else {}
    refused = None
    if rank == 0:
        try:
            processor(ours, hidden[0][:3], embedding_bias=ours.bias)
        except KernelError as exc:
            refused = str(exc)
    processor.prompt_logprobs = {}
    mine = hidden[0][3 * rank:3 * rank + 3]
    after = (processor(ours, mine, embedding_bias=ours.bias), oracle(full, mine, embedding_bias=full.bias))
    torch.save({"passes": results, "refused": refused, "after": after, "report": lm_head_tp.describe_head(ours), "rows": ours.weight.shape[0],
                "shard": ours.weight.detach().clone()}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_worker, WORLD, tmp_path_factory.mktemp("lm_head_tp"))


def test_each_rank_gets_the_full_heads_logits_for_its_own_tokens_uneven_and_idle(ranks):
    for rank, got in enumerate(ranks):
        for counts, (ours, expected) in zip(PASSES, got["passes"]):
            assert ours.shape == expected.shape == (counts[rank], VOCAB)
            torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-6)
    assert ranks[0]["passes"][0][0].abs().sum() > 0  # real logits (soft-capped, scaled), not zeros


def test_prompt_logprobs_are_refused_naming_the_setting_before_any_collective(ranks):
    """vLLM computes prompt logprobs with extra ``compute_logits`` calls on the requesting rank only: under lm-head
    TP each is a group collective the other ranks never join. The processor refuses it (naming the setting) before
    the collective starts: the ranks' next pass still pairs and gives vLLM's logits."""
    refused = ranks[0]["refused"]
    assert refused is not None and ranks[1]["refused"] is None
    assert "prompt logprobs (requests ['req-7'])" in refused and "ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE" in refused
    for got in ranks:
        ours, expected = got["after"]
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-6)


def test_each_rank_holds_and_loads_only_its_vocab_shard(ranks):
    torch.manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN)
    assert [r["report"] for r in ranks] == [{"tp_size": 2, "vocab_per_rank": 64, "bytes": 64 * HIDDEN * 4}] * 2
    assert [r["report"] for r in ranks] == [head_report(VOCAB, HIDDEN, 2, 4)] * 2  # the bench's function agrees
    torch.testing.assert_close(ranks[0]["shard"], weight[:64], rtol=0, atol=0)
    torch.testing.assert_close(ranks[1]["shard"][:36], weight[64:], rtol=0, atol=0)
    assert ranks[1]["shard"][36:].abs().sum() == 0  # padding rows


def test_the_layers_plugins_configure_hook_refuses_it_before_anything_else():
    """The refusal is wired into start-up: the plugin's ``ascend_kernel_configure`` (the platform's config check)."""
    from ascend_kernel_plugins.layers.plugin import ascend_kernel_configure

    settings = SimpleNamespace(lmhead_tensor_parallel_size=2, forced=lambda name: None)
    with pytest.raises(KernelError, match="tensor parallelism 2: lm-head TP is for pure data parallelism"):
        ascend_kernel_configure(settings=settings, vllm_config=_config(tp=2), device=SimpleNamespace(kind="cpu"))

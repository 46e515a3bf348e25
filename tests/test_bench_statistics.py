"""The overhead bench's statistics: a launch-level effect must widen the interval, not hide in it."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "step_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("step_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_block_time_is_the_low_quantile_of_the_steps(bench):
    steps = [9, 1, 5, 3, 7]  # sorted: 1 3 5 7 9
    assert bench.block_time(steps, 0.0) == 1
    assert bench.block_time(steps, 0.5) == 5
    assert bench.block_time(steps, 0.1) == pytest.approx(1 + 0.4 * 2)


def _launches(offsets, pairs, noise, seed=1):
    rng = random.Random(seed)
    return [[1.0 + off + rng.gauss(0, noise) for _ in range(pairs)] for off in offsets]


def test_interval_covers_a_true_ratio_of_one_despite_launch_offsets(bench):
    """Each launch carries its own layout offset (as --calibrate shows); the interval must resample launches."""
    offsets = [0.03, -0.02, 0.04, -0.035, 0.01, -0.01, 0.025, -0.03]
    launches = _launches(offsets, pairs=200, noise=0.02)
    low, high = bench.bootstrap_median(launches, rounds=2000)
    assert low < 1.0 < high
    # resampling pairs alone (one pooled launch) would call the same data precise, and miss the launch spread
    pooled_low, pooled_high = bench.bootstrap_median([[r for launch in launches for r in launch]], rounds=2000)
    assert (high - low) > 2 * (pooled_high - pooled_low)


def test_interval_excludes_one_for_a_real_overhead(bench):
    launches = _launches([0.05 + off for off in (0.003, -0.002, 0.001, -0.003, 0.002, 0.0)], pairs=50, noise=0.02)
    low, high = bench.bootstrap_median(launches, rounds=2000)
    assert 1.0 < low < 1.05 < high


def test_rounds_nested_in_launches_are_resampled_at_every_level(bench):
    """With forked rounds, the data nest launches > rounds > pairs: a launch offset shared by its rounds still counts once."""
    rng = random.Random(5)
    offsets = [0.04, -0.03, 0.05, -0.04, 0.02, -0.02, 0.03, -0.05, 0.01, -0.01]
    nested = [[[1.0 + off + rng.gauss(0, 0.01) for _ in range(20)] for _ in range(6)] for off in offsets]
    low, high = bench.bootstrap_median(nested, rounds=2000)
    assert low < 1.0 < high
    # taking every round as a launch of its own would call the launch offsets six times better measured
    flat_rounds = [pairs for launch in nested for pairs in launch]
    round_low, round_high = bench.bootstrap_median(flat_rounds, rounds=2000)
    assert (high - low) > 1.5 * (round_high - round_low)
    assert bench._flatten(nested) == [x for launch in nested for pairs in launch for x in pairs]


def test_stock_engine_loads_every_vllm_plugin_but_the_kernels(bench):
    """Stock and kernel processes must differ by the kernel alone: vLLM's own general plugins load in both."""
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for group in ("vllm.general_plugins", "vllm.platform_plugins")
                 for ep in entry_points(group=group)}
    allowed = bench._vllm_plugins_but_the_kernel()
    assert "ascend_kernel" in installed and "ascend_kernel" not in allowed
    assert set(allowed) >= {name for name, value in installed.items() if not value.startswith("ascend_kernel")}

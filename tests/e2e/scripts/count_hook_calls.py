"""Run a kernel engine in-process and count pluggy hook calls during generation.

Printed as JSON: calls during engine start-up and during generate() (the
decode loop). Used by test_no_pluggy_in_decode_loop.
"""

import json
import sys

model, max_tokens = sys.argv[1], int(sys.argv[2])

from vllm import LLM, SamplingParams  # noqa: E402

from ascend_kernel import kernel as kernel_mod  # noqa: E402

llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
pm = kernel_mod.current().plugins.pm
calls: list[str] = []
undo = pm.add_hookcall_monitoring(lambda name, impls, kw: calls.append(name), lambda *a: None)
out = llm.generate(["The capital of France is", "Once upon a time"],
                   SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
decode_calls = list(calls)
pm.hook.ascend_kernel_samplers()  # a probe: proves the monitor sees hook calls
undo()
report = llm.collective_rpc("ascend_kernel_report")[0]
print(json.dumps({"decode_hook_calls": decode_calls, "probe_calls": calls[len(decode_calls):], "steps": report["trace"]["steps"],
                  "generated": [len(o.outputs[0].token_ids) for o in out]}))

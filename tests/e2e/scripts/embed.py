"""Embed prompts with vLLM (pooling runner) and print the embeddings and the kernel report as JSON."""

import json
import sys

from vllm import LLM

model, prompts = sys.argv[1], sys.argv[2:]
llm = LLM(model=model, runner="pooling", dtype="float32", enforce_eager=True, max_model_len=256)
outs = llm.embed(prompts)
try:
    report = llm.collective_rpc("ascend_kernel_report")[0]
except Exception:  # noqa: BLE001 - stock vLLM has no kernel report
    report = None
print("RESULT " + json.dumps({"embeddings": [o.outputs.embedding for o in outs], "report": report}))

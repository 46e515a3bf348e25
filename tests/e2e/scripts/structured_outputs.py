"""One engine, one batch of structured-output requests: a JSON schema, a regex and a choice, greedy and sampled.

argv[1] is a JSON object: ``model``, ``kernel`` (false: stock vLLM-CPU),
``engine`` (more ``LLM`` keyword arguments: ``async_scheduling``,
``speculative_config``...), ``modes`` (default both: greedy, sampled). Kernel settings come from the environment
(``ASCEND_KERNEL_SAMPLER``...). Printed as JSON: per request its constraint,
tokens, text and finish reason, the kernel's report (None on stock vLLM) and
vLLM's speculative-decoding counters. Used by tests/e2e/test_structured_outputs.py.
"""

import json
import sys

spec = json.loads(sys.argv[1])

from ascend_kernel.cli import engine  # noqa: E402

engine.prepare_process(kernel=spec["kernel"])

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}
REGEX = r"(yes|no), [0-9]{1,3}"
CHOICES = ["Paris", "London", "Berlin", "Rome"]
CONSTRAINTS = {"json": StructuredOutputsParams(json=SCHEMA), "regex": StructuredOutputsParams(regex=REGEX),
               "choice": StructuredOutputsParams(choice=CHOICES), "none": None}
PROMPTS = {"json": "Answer in JSON: the colour of the sky is", "regex": "Is the earth round? Answer and count:",
           "choice": "The capital of France is", "none": "Once upon a time, there was a little"}
# greedy, then seeded random sampling through the sampler's top-k/top-p path
SAMPLING = {"greedy": {"temperature": 0.0},
            "sampled": {"temperature": 1.0, "top_k": 20, "top_p": 0.9}}

extra = {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}, **spec.get("engine", {})}
request = engine.EngineRequest(model=spec["model"], kernel=spec["kernel"], max_model_len=256, extra=extra)
llm = engine.build_llm(request)
keys, prompts, params = [], [], []
for mode in spec.get("modes", list(SAMPLING)):
    sampling = SAMPLING[mode]
    for index, (kind, constraint) in enumerate(CONSTRAINTS.items()):
        keys.append((kind, mode))
        prompts.append(PROMPTS[kind])
        params.append(SamplingParams(max_tokens=spec.get("max_tokens", 32), seed=100 + index,
                                     structured_outputs=constraint, **sampling))
outputs = llm.generate(prompts, params, use_tqdm=False)
result = {
    "outputs": [{"kind": kind, "mode": mode, "token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
                 "finish_reason": o.outputs[0].finish_reason}
                for (kind, mode), o in zip(keys, outputs)],
    "report": engine.kernel_report(llm),
    "spec_decode": engine.spec_decode_counts(llm),
    "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
}
engine.shutdown(llm)
print("\n" + json.dumps(result))

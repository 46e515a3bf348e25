"""A mixed LoRA batch in one engine: base prompts alone, then 3 base + 3 adapter requests (max_loras=1).

argv: stock|kernel, model dir, adapter dir. Used by tests/e2e/test_lora.py.
"""
import json, sys
from ascend_kernel.cli import engine
engine.prepare_process(kernel=sys.argv[1] == "kernel")
from vllm import SamplingParams
from vllm.lora.request import LoRARequest
llm = engine.build_llm(engine.EngineRequest(model=sys.argv[2], kernel=sys.argv[1] == "kernel",
      extra={"enable_lora": True, "max_loras": 1, "max_lora_rank": 8}))
P = ["The capital of France is", "Once upon a time, there was a little", "The quick brown fox jumps over"]
sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ad = LoRARequest("a", 1, sys.argv[3])
base = [o.outputs[0].token_ids for o in llm.generate(P, sp, use_tqdm=False)]
mixed = [o.outputs[0].token_ids for o in llm.generate(P + P, sp, lora_request=[None]*3 + [ad]*3, use_tqdm=False)]
print(json.dumps({"base": [list(x) for x in base], "mixed": [list(x) for x in mixed]}))

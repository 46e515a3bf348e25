"""One engine through sleep level 1 and level 2 and back: tokens, RSS, cached tokens and pool states at each step.

argv: model dir. Used by tests/e2e/test_sleep_mode.py. With VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine's worker
is this process, so this process's RSS is the worker's.
"""
import json, sys
import psutil
from ascend_kernel.cli import engine
engine.prepare_process(kernel=True)
from vllm import SamplingParams
llm = engine.build_llm(engine.EngineRequest(model=sys.argv[1], kernel=True,
      extra={"enable_sleep_mode": True, "enable_prefix_caching": True, "block_size": 32}))
P = json.loads(sys.argv[2])
sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
rss = lambda: psutil.Process().memory_info().rss
def run(key):
    outs = llm.generate(P, sp, use_tqdm=False)
    out[key] = [list(o.outputs[0].token_ids) for o in outs]
    out[key + "_cached"] = [o.num_cached_tokens for o in outs]
    out.setdefault("prompt_ids", [list(o.prompt_token_ids) for o in outs])
pools = lambda: llm.collective_rpc(lambda w: w.ascend_kernel_sleep_mode.describe())[0]
weights_sum = lambda: llm.collective_rpc(
    lambda w: float(sum(p.detach().abs().sum() for p in w.model_runner.get_model().parameters())))[0]
out = {"kv_bytes": llm.collective_rpc("ascend_kernel_report")[0]["kv_cache"]["allocated_bytes"]}
run("before")
run("before_again")  # the prefix cache now holds the prompts' full blocks
out["weights_sum_before"], out["rss_awake1"] = weights_sum(), rss()
llm.sleep(level=1)
out["rss_sleep1"], out["pools_sleep1"], out["sleeping1"] = rss(), pools(), llm.llm_engine.is_sleeping()
out["fully_awake1"] = llm.wake_up()
out["pools_woken1"], out["sleeping_woken1"] = pools(), llm.llm_engine.is_sleeping()
run("after1")
out["rss_awake2"] = rss()
llm.sleep(level=2)
out["rss_sleep2"], out["pools_sleep2"] = rss(), pools()
out["partly_awake"] = llm.wake_up(tags=["weights"])
out["weights_sum_unloaded"] = weights_sum()
llm.collective_rpc("reload_weights")
out["weights_sum_reloaded"] = weights_sum()
out["fully_awake2"] = llm.wake_up(tags=["kv_cache"])
out["pools_woken2"] = pools()
run("after2")
print(json.dumps(out))

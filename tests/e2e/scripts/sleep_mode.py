"""One engine through sleep level 1 and level 2 and back: tokens, RSS and pool states at each step.

argv: model dir. Used by tests/e2e/test_sleep_mode.py (VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine's worker
is this process, so this process's RSS is the worker's).
"""
import json, sys
import psutil
from ascend_kernel.cli import engine
engine.prepare_process(kernel=True)
from vllm import SamplingParams
llm = engine.build_llm(engine.EngineRequest(model=sys.argv[1], kernel=True,
      extra={"enable_sleep_mode": True, "enable_prefix_caching": True}))
P = ["The capital of France is", "Once upon a time, there was a little", "The quick brown fox jumps over"]
sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
rss = lambda: psutil.Process().memory_info().rss
run = lambda: [list(o.outputs[0].token_ids) for o in llm.generate(P, sp, use_tqdm=False)]
pools = lambda: llm.collective_rpc(lambda w: w.ascend_kernel_sleep_mode.describe())[0]
weights_sum = lambda: llm.collective_rpc(lambda w: float(sum(p.abs().sum() for p in w.model_runner.get_model().parameters())))[0]
out = {"kv_bytes": llm.collective_rpc("ascend_kernel_report")[0]["kv_cache"]["allocated_bytes"]}
out["before"] = run()
out["weights_sum_before"] = weights_sum()
out["rss_awake"] = rss()
llm.sleep(level=1)
out["rss_sleep1"], out["pools_sleep1"], out["sleeping1"] = rss(), pools(), llm.llm_engine.is_sleeping()
llm.wake_up()
out["rss_woken1"], out["pools_woken1"], out["sleeping_woken1"] = rss(), pools(), llm.llm_engine.is_sleeping()
out["after1"] = run()
out["rss_awake2"] = rss()
llm.sleep(level=2)
out["rss_sleep2"], out["pools_sleep2"] = rss(), pools()
llm.wake_up(tags=["weights"])
out["weights_sum_woken_unloaded"] = weights_sum()
llm.collective_rpc("reload_weights")
out["weights_sum_reloaded"] = weights_sum()
out["fully_awake"] = llm.wake_up(tags=["kv_cache"])
out["pools_woken2"] = pools()
out["after2"] = run()
print(json.dumps(out))

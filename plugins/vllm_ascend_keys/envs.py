"""vllm-ascend's environment variables (its ``envs.py`` at v0.11.0rc1, v0.18.0rc1, v0.23.0 and main, and the
seed's) and what the kernel does with each. Build-time variables (``SOC_VERSION``, ``MAX_JOBS``, ...) configure
vllm-ascend's compilation, not an engine, and are not read."""

from __future__ import annotations

from typing import Any, Mapping

from ascend_kernel_plugins.vllm_ascend_keys.keys import EPLB_INSTEAD, REMOVE, SP
from ascend_kernel_plugins.vllm_ascend_keys.rules import Off, Outcome, Refused, Setting, apply, as_bool, unknown

PREFIX = "VLLM_ASCEND_"
PD_INSTEAD = "--kv-transfer-config with MooncakeConnector (the kernel's prefill/decode disaggregation)"

#: variable -> (rule, where vllm-ascend reads it)
ENVS: dict[str, tuple[Any, str]] = {
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": (Setting("sequence_parallel", feature=SP), "v0.11.0rc1-v0.23.0"),
    "VLLM_ASCEND_ENABLE_FUSED_MC2": (Setting("enable_fused_mc2", feature="the fused MC2 MoE kernel"),
                                     "v0.18.0rc1-main (seed platform)"),
    "VLLM_ASCEND_ENABLE_TOPK_TOPP_OPTIMIZATION": (Setting("enable_topk_topp_optimization",
                                                          feature="the Ascend top-k/top-p sampler"),
                                                  "v0.11.0rc1 (seed runner)"),
    "VLLM_ASCEND_ENABLE_DBO": (Setting("enable_dbo", feature="dual-batch overlap"), "v0.11.0rc1 (seed runner)"),
    "VLLM_ASCEND_ENABLE_PREFETCH_MLP": (Setting("enable_prefetch_mlp", feature="MLP weight prefetch"),
                                        "v0.11.0rc1 (seed runner)"),
    "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": (Off("fused matmul + all-reduce", REMOVE), "v0.11.0rc1-v0.23.0"),
    "VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE": (Off("FlashComm v2 (removed upstream)", REMOVE), "v0.18.0rc1-v0.23.0"),
    "VLLM_ASCEND_ENABLE_MLAPO": (Off("fused MLA preprocessing (MLAPO)", REMOVE), "v0.11.0rc1-main"),
    "VLLM_ASCEND_ENABLE_NZ": (Off("NZ-format weights (its weights stay ND)", REMOVE), "v0.11.0rc1-main"),
    "VLLM_ASCEND_BALANCE_SCHEDULING": (Off("balance scheduling across DP ranks", REMOVE), "v0.18.0rc1-main"),
    "VLLM_ASCEND_FUSION_OP_TRANSPOSE_KV_CACHE_BY_BLOCK": (Off("block-transposed KV transfer op", REMOVE),
                                                          "v0.18.0rc1-main"),
    "VLLM_ASCEND_ENABLE_BATCH_MEMCPY": (Off("batched device memcpy", REMOVE), "v0.23.0-main"),
    "VLLM_ASCEND_ENABLE_CONTEXT_PARALLEL": (Off("context parallelism", REMOVE), "v0.18.0rc1"),
    "VLLM_ASCEND_ENABLE_VNPU": (Off("vNPU memory sharing", REMOVE), "seed platform"),
    "VLLM_ASCEND_TRACE_RECOMPILES": (Off("recompile tracing of its own", "TORCH_LOGS=recompiles"), "v0.11.0rc1"),
    "VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE": (Off("model execute-time observer", "the engine's report "
                                                   "(`ascend-kernel generate --json`) and bench/"), "v0.11.0rc1"),
    "VLLM_ASCEND_KV_CACHE_MEGABYTES_FLOATING_TOLERANCE": (Refused(
        "the kernel sizes the KV cache as vLLM does", "--gpu-memory-utilization (NPU) or VLLM_CPU_KVCACHE_SPACE "
        "(CPU host)"), "v0.11.0rc1"),
    "VLLM_ASCEND_LLMDD_RPC_IP": (Refused("the kernel has no LLMDataDist connector", PD_INSTEAD), "v0.11.0rc1"),
    "VLLM_ASCEND_LLMDD_RPC_PORT": (Refused("the kernel has no LLMDataDist connector", PD_INSTEAD), "v0.11.0rc1"),
    "VLLM_ASCEND_KVCACHE_DELAY_FREE_TIMEOUT": (Refused("the kernel has no LLMDataDist connector", PD_INSTEAD),
                                               "v0.11.0rc1"),
    "DISAGGREGATED_PREFILL_RANK_TABLE_PATH": (Refused("the kernel has no LLMDataDist connector", PD_INSTEAD),
                                              "v0.11.0rc1"),
    "VLLM_ASCEND_MLA_PA": (Off("paged attention switch for MLA decode", REMOVE), "v0.11.0rc1"),
    "VLLM_ASCEND_MLP_GATE_UP_PREFETCH_SIZE": (Refused("the kernel has no MLP weight prefetch", REMOVE),
                                              "v0.11.0rc1"),
    "VLLM_ASCEND_MLP_DOWN_PREFETCH_SIZE": (Refused("the kernel has no MLP weight prefetch", REMOVE), "v0.11.0rc1"),
    "VLLM_ASCEND_ENABLE_DENSE_OPTIMIZE": (Off("dense-model optimization switch", REMOVE), "v0.11.0rc1"),
    "VLLM_ASCEND_ENABLE_MLP_OPTIMIZE": (Off("MLP optimization switch", REMOVE), "v0.11.0rc1"),
    "VLLM_ENABLE_FUSED_EXPERTS_ALLGATHER_EP": (Off("fused all-gather expert path", "ASCEND_KERNEL_MOE_COMM_METHOD"),
                                               "v0.11.0rc1"),
    "MSMONITOR_USE_DAEMON": (Off("msMonitor daemon", REMOVE), "v0.11.0rc1-main"),
    "DYNAMIC_EPLB": (Off("EPLB switch in the environment alone", EPLB_INSTEAD), "v0.18.0rc1-main"),
    "EXPERT_MAP_RECORD": (Off("EPLB switch in the environment alone", EPLB_INSTEAD), "v0.13.0-main"),
}

#: variables vllm-ascend requires beside a key (its eplb_config asserts DYNAMIC_EPLB with dynamic_eplb): honored on
#: while that key is on, as the companion of what the key maps onto
COMPANIONS = {"DYNAMIC_EPLB": "dynamic_eplb", "EXPERT_MAP_RECORD": "dynamic_eplb"}


def _companion_on(name: str, value: str, config: Mapping[str, Any]) -> bool:
    eplb = config.get("eplb_config")
    return name in COMPANIONS and isinstance(eplb, Mapping) and as_bool(eplb.get(COMPANIONS[name])) and as_bool(value)


#: variable -> the additional_config key that replaces it (vllm-ascend reads the variable only without the key)
REPLACED_BY = {
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": "enable_flashcomm1", "VLLM_ASCEND_ENABLE_FUSED_MC2": "enable_fused_mc2",
    "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "enable_matmul_allreduce", "VLLM_ASCEND_ENABLE_MLAPO": "enable_mlapo",
    "VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE": "enable_flashcomm2_parallel_size", "VLLM_ASCEND_ENABLE_NZ": "weight_nz_mode",
    "VLLM_ASCEND_BALANCE_SCHEDULING": "enable_balance_scheduling", "MSMONITOR_USE_DAEMON": "msmonitor_use_daemon",
    "VLLM_ASCEND_FUSION_OP_TRANSPOSE_KV_CACHE_BY_BLOCK": "enable_transpose_kv_cache_by_block",
}


def outcomes(environ: Mapping[str, str], fields: frozenset[str], config: Mapping[str, Any]) -> list[Outcome]:
    """The variables' outcomes; one whose replacing key is in ``config`` is not read (as in vllm-ascend)."""
    found: list[Outcome] = []
    for name, value in sorted(environ.items()):
        if REPLACED_BY.get(name, "") in config:
            continue
        if _companion_on(name, value, config):
            found.append(Outcome("$" + name, value, effect=f"the switch vllm-ascend requires beside "
                                 f"eplb_config.{COMPANIONS[name]}, which the kernel maps"))
            continue
        if name in ENVS:
            found.extend(apply(ENVS[name][0], "$" + name, value, fields))
        elif name.startswith(PREFIX):
            found.append(unknown("$" + name, value, sorted(ENVS), "no variable vllm-ascend reads"))
    return found

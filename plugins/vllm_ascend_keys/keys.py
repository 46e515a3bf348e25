"""Every top-level key of vllm-ascend's ``additional_config`` and what the kernel does with it.

The keys are those vllm-ascend's ``AscendConfig`` (and the modules around it) read from v0.9.1 to v0.23.0 and
on main (commit 182b75ea84), plus the ones the seed runner and platform read. ``seen`` says where a key
appears, so a user of an old release finds it too. The rules are in :mod:`.rules`; docs/vllm-ascend-config.md
is generated from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ascend_kernel_plugins.vllm_ascend_keys.rules import (
    Honored, Off, Outcome, Passed, Refused, Section, Setting, apply, as_bool, as_group_size, is_off, unknown,
)

GRAPH_INSTEAD = ("ASCEND_KERNEL_GRAPH_MODE (aclgraph on an NPU, cpu-graph on a CPU host) with "
                 "ASCEND_KERNEL_GRAPH_CAPTURE_SIZES")
REMOVE = "leave the key out"
EPLB_INSTEAD = "additional_config.eplb_config (dynamic_eplb, num_redundant_experts, ...), which the kernel maps"
SP = "sequence parallelism (FlashComm v1)"


@dataclass(frozen=True)
class EplbSection(Section):
    """vllm-ascend's EPLB cycle in vLLM's terms: load is gathered over ``expert_heat_collection_interval`` steps
    and the experts move every heat + ``algorithm_execution_interval`` steps (its updater's cycle).

    Where the section says ``dynamic_eplb`` is off, its tuning keys tune nothing in vllm-ascend, so they map onto
    nothing here either (a launch command that writes out vllm-ascend's defaults would otherwise hand the EPLB
    plugin a cycle for an EPLB that is off, which it refuses). Left out, they map as given: the kernel's own
    ``enable_eplb`` may turn EPLB on, and a cycle for an EPLB that stays off is then the plugin's clear error.
    """

    def apply_all(self, path: str, value: Any, fields: frozenset[str]) -> list[Outcome]:
        outcomes = super().apply_all(path, value, fields)
        if not isinstance(value, Mapping):
            return outcomes
        if "dynamic_eplb" in value and not as_bool(value["dynamic_eplb"]):
            return [_tunes_nothing(o) if _dynamic_only(o) else o for o in outcomes]
        if "algorithm_execution_interval" in value:
            heat = value.get("expert_heat_collection_interval", 600)
            outcomes = [_step_interval(o, heat) if o.path.endswith(".algorithm_execution_interval") else o
                        for o in outcomes]
        return outcomes


#: eplb_config's sub-keys that only tune dynamic EPLB (num_redundant_experts too, at 0)
DYNAMIC_EPLB_TUNING = ("expert_heat_collection_interval", "algorithm_execution_interval", "eplb_policy_type",
                       "eplb_heat_collection_stage", "load_collection_phase")


def _dynamic_only(outcome: Outcome) -> bool:
    key = outcome.path.rsplit(".", 1)[-1]
    return key in DYNAMIC_EPLB_TUNING or (key == "num_redundant_experts" and outcome.value == 0)


def _tunes_nothing(outcome: Outcome) -> Outcome:
    return Outcome(outcome.path, outcome.value, effect="nothing to do: dynamic_eplb is off in this section, so "
                                                       "this tunes nothing (as in vllm-ascend)")


def _step_interval(outcome: Outcome, heat: Any) -> Outcome:
    if outcome.refusal or not isinstance(heat, int):
        return outcome
    steps = heat + outcome.settings["eplb_config.step_interval"]
    return Outcome(outcome.path, outcome.value, {"eplb_config.step_interval": steps},
                   f"setting eplb_config step_interval={steps} (heat collection {heat} + algorithm {outcome.value})")


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("a whole number >= 0 expected")
    return value


def _unset(value: Any) -> bool:
    return value is None or value == ""


def _all_phases(value: Any) -> bool:
    return value == "all"


EPLB = EplbSection({
    "dynamic_eplb": Setting("enable_eplb", feature="the EPLB plugin"),
    "num_redundant_experts": Setting("eplb_config.num_redundant_experts", _positive_int, "the EPLB plugin"),
    "expert_heat_collection_interval": Setting("eplb_config.window_size", _positive_int, "the EPLB plugin"),
    "algorithm_execution_interval": Setting("eplb_config.step_interval", _positive_int, "the EPLB plugin"),
    # null is vllm-ascend's default (no file): honored; a path names a file in vllm-ascend's own format
    "expert_map_path": Off("reader of vllm-ascend's expert-map file format", "ASCEND_KERNEL_EPLB_REPLAY_PATH with "
                           "a map the kernel recorded", _unset),
    "expert_map_record_path": Off("writer of vllm-ascend's expert-map file format",
                                  "ASCEND_KERNEL_EPLB_RECORD_PATH (the kernel's own format)", _unset),
    "eplb_policy_type": Refused("vllm-ascend's policies 0-3 are not the kernel's (any value is honored where "
                                "the section sets dynamic_eplb off: no policy runs)",
                                'ascend_kernel.eplb_config {"policy": NAME} (vLLM\'s default or an eplb_policy '
                                "plugin's, listed by `ascend-kernel plugins`)"),
    "eplb_heat_collection_stage": Off("load collection restricted to prefill or decode", "'all'", _all_phases),
    "load_collection_phase": Off("load collection restricted to prefill or decode", "'all'", _all_phases),
}, "vllm-ascend's eplb_config")

TORCHAIR = Off("TorchAir graph mode (removed from vllm-ascend in v0.12)", GRAPH_INSTEAD)
FUSION_SETTING = "a fusion_pass plugin"


def _fuse(name: str) -> Setting:
    return Setting(name, feature=f"{FUSION_SETTING} ({name})")


COMPILATION = Section({
    "fuse_norm_quant": _fuse("fuse_norm_quant"),
    "fuse_qknorm_rope": _fuse("fuse_qknorm_rope"),
    "fuse_muls_add": _fuse("fuse_muls_add"),
    "fuse_allreduce_rms": _fuse("fuse_allreduce_rms"),
    "enable_npugraph_ex": Off("npugraph_ex backend", f"vLLM's compilation or {GRAPH_INSTEAD}"),
    "enable_static_kernel": Off("static-kernel compilation (npugraph_ex)", REMOVE),
}, "vllm-ascend's ascend_compilation_config")

LMHEAD_TP = Setting("lmhead_tensor_parallel_size", convert=as_group_size,
                    feature="lm-head tensor parallelism over a group of DP ranks",
                    expects="a whole number >= 1 dividing the DP size (0 or null: off)")

FINEGRAINED_TP = Section({
    "lmhead_tensor_parallel_size": LMHEAD_TP,
    **{name: Off(f"{what} tensor parallelism over its own group", REMOVE)
       for name, what in (("oproj_tensor_parallel_size", "o_proj"), ("embedding_tensor_parallel_size", "embedding"),
                          ("mlp_tensor_parallel_size", "MLP"), ("olora_tensor_parallel_size", "o_proj LoRA"))},
}, "vllm-ascend's finegrained_tp_config")


def _enabled_only(what: str, feature: str, instead: str, extra: tuple[str, ...] = ()) -> Section:
    """A ``{"enabled": ..., ...}`` section: honored while disabled (its other sub-keys then do nothing there)."""
    off = Off(feature, instead)
    quiet = Honored(f"{what} is not enabled, so this does nothing (as in vllm-ascend)")
    return _Enabled({"enabled": off, **{k: quiet for k in extra}}, what)


@dataclass(frozen=True)
class _Enabled(Section):
    def apply_all(self, path: str, value: Any, fields: frozenset[str]) -> list[Outcome]:
        outcomes = super().apply_all(path, value, fields)
        if isinstance(value, Mapping) and not is_off(value):  # enabled: the section's refusal says it all
            return [o for o in outcomes if o.path.endswith(".enabled") or "is no key" in o.refusal]
        return outcomes


SHORT_REQUEST_FIRST = _enabled_only("short_request_first_config", "short-request-first scheduling", REMOVE,
                                    ("threshold", "long_max_wait_ms"))
PROFILING_CHUNK = _enabled_only("profiling_chunk_config", "profiling-based chunk sizing", REMOVE,
                                ("min_chunk", "max_fit_chunk", "smooth_factor", "need_timing"))
BATCH_JOB_SCHED = _enabled_only("batch_job_sched_config", "batch-job scheduling", REMOVE, (
    "max_jobs", "reserve_margin_blocks", "reserve_max_blocks", "low_available_tokens_threshold",
    "short_decode_token_threshold"))

#: key -> (rule, where vllm-ascend reads it)
KEYS: dict[str, tuple[Any, str]] = {
    # -- graph modes and compilation
    "torchair_graph_config": (_enabled_only("torchair_graph_config", "TorchAir graph mode (removed from "
                              "vllm-ascend in v0.12)", GRAPH_INSTEAD, (
                                  "mode", "use_cached_graph", "use_cached_kv_cache_bytes", "graph_batch_sizes",
                                  "graph_batch_sizes_init", "enable_multistream_mla", "enable_multistream_moe",
                                  "enable_view_optimize", "enable_frozen_parameter", "enable_kv_nz",
                                  "enable_super_kernel")), "v0.9.1-v0.11.0 (seed runner)"),
    "xlite_graph_config": (_enabled_only("xlite_graph_config", "Xlite graph runtime", GRAPH_INSTEAD,
                                         ("full_mode",)), "v0.12.0rc1-main (seed platform)"),
    "ascend_compilation_config": (COMPILATION, "v0.12.0rc1-main (seed platform)"),
    "enable_npugraph_ex": (Off("npugraph_ex backend", GRAPH_INSTEAD), "v0.12.0rc1-v0.13.0"),
    "npugraph_ex_config": (_enabled_only("npugraph_ex_config", "npugraph_ex backend", GRAPH_INSTEAD,
                                         ("enable_static_kernel",)), "v0.14.0rc1-v0.15.0rc1"),
    "ascend_fusion_config": (Section({"fusion_ops_gmmswigluquant": Off(
        "fused grouped-matmul + SwiGLU + quant expert op (its int8 experts run them as separate seam ops)",
        REMOVE)}, "vllm-ascend's ascend_fusion_config"), "v0.14.0rc1-main (seed platform)"),
    # -- scheduling
    "ascend_scheduler_config": (_enabled_only("ascend_scheduler_config", "AscendScheduler (removed from "
                                "vllm-ascend in v0.12; vLLM's V1 scheduler runs)",
                                "--engine-arg enable_chunked_prefill=false for prefill without chunking",
                                ("enable_chunked_prefill", "max_long_partial_prefills", "long_prefill_token_threshold",
                                 "policy", "scheduler_cls")), "v0.9.1-v0.11.0 (seed runner)"),
    "scheduler_config": (Section({
        "enable_balance_scheduling": Off("balance scheduling across DP ranks", REMOVE),
        "recompute_scheduler_enable": Off("recompute scheduler", REMOVE),
        "short_request_first_config": SHORT_REQUEST_FIRST,
        "profiling_chunk_config": PROFILING_CHUNK,
        "batch_job_sched_config": BATCH_JOB_SCHED,
        "dyntra_lb_config": _enabled_only("dyntra_lb_config", "dynamic DP load balancing", REMOVE, (
            "enable_diagnostics", "mode", "start_step", "end_step", "bubble_threshold", "long_req_block_threshold",
            "dynamic_max_step")),
    }, "vllm-ascend's scheduler_config"), "main"),
    # main still reads these two at the top level when scheduler_config does not give them (deprecated there)
    "short_request_first_config": (SHORT_REQUEST_FIRST, "main (deprecated for scheduler_config's)"),
    "batch_job_sched_config": (BATCH_JOB_SCHED, "main (deprecated for scheduler_config's)"),
    "enable_balance_scheduling": (Off("balance scheduling across DP ranks", REMOVE), "v0.23.0"),
    "recompute_scheduler_enable": (Off("recompute scheduler", REMOVE), "v0.11.0rc1-v0.23.0 (seed platform)"),
    "SLO_limits_for_dynamic_batch": (Off("SLO-driven dynamic batch sizing", REMOVE, lambda v: v in (-1, None)),
                                     "v0.12.0rc1-v0.23.0 (seed platform)"),
    "profiling_chunk_config": (PROFILING_CHUNK, "v0.19.1rc1-main (deprecated on main for scheduler_config's)"),
    # -- communication and parallelism
    "enable_flashcomm1": (Setting("sequence_parallel", feature=SP), "v0.23.0 (removed on main)"),
    "enable_flashcomm2_parallel_size": (Off("FlashComm v2 (removed upstream)", REMOVE), "v0.23.0"),
    "enable_matmul_allreduce": (Off("fused matmul + all-reduce", REMOVE), "v0.23.0"),
    "finegrained_tp_config": (FINEGRAINED_TP, "v0.12.0rc1-main"),
    "lmhead_tensor_parallel_size": (LMHEAD_TP, "v0.10.2rc1-v0.11.0"),
    "oproj_tensor_parallel_size": (Off("o_proj tensor parallelism over its own group", REMOVE),
                                   "v0.10.2rc1-v0.11.0"),
    "lmhead_tp_size": (LMHEAD_TP, "v0.9.1"),
    "layer_sharding": (Off("linear-layer sharding", REMOVE), "v0.13.0-v0.23.0"),
    "dp_allreduce_on_npu": (Off("DP metadata all-reduce on the device group", REMOVE), "v0.23.0"),
    "enable_dsa_cp": (Off("DSA context parallelism", REMOVE), "v0.23.0-main"),
    # -- MoE
    "enable_fused_mc2": (Setting("enable_fused_mc2", feature="the fused MC2 MoE kernel"), "v0.23.0-main"),
    "enable_mc2_hierarchy_comm": (Setting("enable_mc2_hierarchy_comm", feature="hierarchical MC2"),
                                  "v0.18.0rc1-main (seed platform)"),
    "enable_prefill_mc2": (Off("MC2 for prefill batches (its MoE policy follows the seed runner: MC2 within the "
                               "token capacity)", "ASCEND_KERNEL_MOE_COMM_METHOD=mc2 to force MC2"), "v0.23.0-main"),
    "enable_shared_expert_dp": (Off("shared experts under DP", REMOVE), "v0.10.2rc1-main"),
    "multistream_overlap_shared_expert": (Off("second NPU stream for shared experts", REMOVE),
                                          "v0.11.0rc1-main"),
    "multistream_overlap_gate": (Off("second NPU stream for the MoE gate", REMOVE), "v0.13.0-v0.23.0"),
    "multistream_dsv4_dsa_overlap": (Off("DeepSeek-V4 DSA stream overlap", REMOVE), "v0.23.0-main"),
    "mega_moe_max_tokens": (Refused("the kernel has no mega-MoE (dispatch_ffn_combine) operator, whose capacity "
                                    "this is", REMOVE), "v0.23.0-main"),
    "mix_placement": (Off("mixed placement of shared and routed experts", REMOVE), "v0.13.0-main"),
    "eplb_config": (EPLB, "v0.13.0-main"),
    "dynamic_eplb": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD), "v0.9.1-v0.13.0"),
    "expert_map_path": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD), "v0.9.1-v0.13.0"),
    "expert_map_record_path": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD),
                               "v0.11.0rc1-v0.13.0 (seed runner)"),
    "eplb_policy_type": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD),
                         "v0.11.0rc1-v0.13.0 (seed runner)"),
    "init_redundancy_expert": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD),
                               "v0.11.0rc1-v0.13.0"),
    "num_iterations_eplb_update": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD),
                                   "v0.9.1-v0.13.0"),
    "num_wait_worker_iterations": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD),
                                   "v0.9.1-v0.13.0"),
    "gate_eplb": (Refused("moved into eplb_config in vllm-ascend v0.13", EPLB_INSTEAD), "v0.9.1-v0.13.0"),
    # -- attention, KV cache, weights
    "enable_kv_nz": (Off("NZ-format KV cache (its KV layouts are ND)", REMOVE), "v0.13.0-main"),
    "kv_cache_dtype": (Refused("the int8 KV cache is vLLM's cache dtype, not an additional_config key",
                               "--kv-cache-dtype int8_per_token_head (the int8-bsh layout)"), "seed runner"),
    "enable_mlapo": (Off("fused MLA preprocessing (MLAPO)", REMOVE), "v0.23.0-main"),
    "pa_shape_list": (Off("per-shape choice of _npu_paged_attention (its decode always uses it)", REMOVE),
                      "v0.13.0-main"),
    "chunked_prefill_for_mla": (Off("separate MLA chunked-prefill switch", "--engine-arg enable_chunked_prefill"),
                                "v0.10.0rc1-v0.12.0rc1"),
    "enable_transpose_kv_cache_by_block": (Off("block-transposed KV transfer op", REMOVE), "v0.23.0-main"),
    "weight_nz_mode": (Off("NZ-format weights (its weights stay ND)", REMOVE), "v0.23.0-main"),
    "enable_weight_nz_layout": (Off("NZ-format weights (its weights stay ND)", REMOVE), "v0.9.1"),
    "weight_prefetch_config": (_enabled_only("weight_prefetch_config", "weight prefetch (removed upstream)",
                                             REMOVE, ("prefetch_ratio",)), "v0.11.0rc1-v0.23.0 (seed runner)"),
    "enable_prefetch": (Off("weight prefetch (removed upstream)", REMOVE), "v0.10.2rc1"),
    "enable_prefill_optimizations": (Off("prefill optimizations switch", REMOVE), "v0.9.1"),
    "enable_sparse_c8": (Off("int8 sparse-attention caches", REMOVE), "v0.18.0rc1-v0.19.1rc1"),
    "enable_sparse_sfa_c8": (Off("int8 SFA caches", REMOVE), "v0.23.0-main"),
    "enable_sparse_li_c8": (Off("int8 lightning-indexer caches", REMOVE), "v0.23.0-main"),
    "c8_enable_reshape_optim": (Off("int8 lightning-indexer reshape", REMOVE), "v0.23.0-main"),
    "hamming_sparse": (_enabled_only("hamming_sparse", "Hamming sparse attention", REMOVE,
                                     ("sparse_json_location",)), "v0.19.1rc1-v0.23.0"),
    "enable_hamming_sparse": (Off("Hamming sparse attention", REMOVE), "v0.23.0"),
    "sparse_kv_offload_config": (_enabled_only("sparse_kv_offload_config", "sparse KV offload", REMOVE,
                                               ("dram_size_per_dp_GB", "keep_device_kv_cache", "topk_buffer_size")),
                                 "main"),
    # -- sampling and speculative decoding
    "enable_async_exponential": (Off("asynchronous exponential sampling", REMOVE), "v0.13.0-v0.23.0"),
    "enable_reduce_sample": (Off("reduced sampling", REMOVE), "v0.23.0-main"),
    "rejection_sampler_config": (Section({k: Off(f"{k.removeprefix('enable_').replace('_', ' ')}", REMOVE)
                                          for k in ("enable_block_verify", "enable_entropy_verify")} | {
        k: Honored("verification is off, so this does nothing") for k in ("posterior_alpha", "posterior_threshold")},
        "vllm-ascend's rejection_sampler_config"), "v0.23.0-main"),
    "dynamic_spec_config": (Off("dynamic speculative methods (dspark, dflash)", "--speculative-config"), "main"),
    "draft_window_size": (Off("drafter window", "--speculative-config"), "main"),
    # -- process, logging, debugging
    "enable_cpu_binding": (Off("CPU-core binding of its workers", "numactl or taskset around the launch"),
                           "v0.9.1-main"),
    "msmonitor_use_daemon": (Off("msMonitor daemon", REMOVE), "v0.23.0-main"),
    "dump_config": (Refused("the kernel has no msProbe precision dump", REMOVE), "v0.12.0rc1-main"),
    "dump_config_path": (Refused("the kernel has no msProbe precision dump", REMOVE), "v0.13.0-main"),
    "ascend_log_path": (Refused("the kernel logs through vLLM's logging, not to a directory of its own",
                                "VLLM_LOGGING_CONFIG_PATH"), "v0.23.0-main"),
    "enable_sleep_mode_extra_cleanup": (Off("extra clean-up on sleep", REMOVE), "v0.23.0"),
    "rl_config": (_enabled_only("rl_config", "RL-training integration", REMOVE, (
        "sleep_mode_extra_cleanup", "enable_training_consistency", "enable_batch_invariant")),
                  "main"),
    "refresh": (Honored("the kernel reads additional_config afresh for every engine"), "v0.9.1-main"),
}

#: keys that are not vllm-ascend's: vLLM's own, and the kernel's
PASSED: dict[str, Passed] = {
    "ascend_kernel": Passed("the kernel's settings (docs/settings.md)"),
    "ascend_kernel_config_changes": Passed("the kernel (its record of config changes for worker processes)"),
    **{key: Passed("vLLM") for key in ("gdn_prefill_backend", "kda_prefill_backend", "kda_decode_backend",
                                        "kda_prefill_checkpoint")},
}


def outcomes(additional_config: Mapping[str, Any], fields: frozenset[str]) -> list[Outcome]:
    """The outcome of every key of ``additional_config``; the kernel's and vLLM's own keys are left alone."""
    found: list[Outcome] = []
    for key, value in additional_config.items():
        if key in PASSED:
            continue
        if key not in KEYS:
            found.append(unknown(key, value, sorted([*KEYS, *PASSED]), "no key of vllm-ascend's configuration "
                                                                         "nor the kernel's"))
            continue
        found.extend(apply(KEYS[key][0], key, value, fields))
    return found

"""vllm-ascend's additional_config keys and VLLM_ASCEND_* variables: each honored or refused by name.

The key lists below were read off vllm-ascend's ``vllm_ascend/ascend_config.py`` (and the modules that read
``additional_config`` around it) at the v0.23.0 tag (5cb98caaad) and on main (182b75ea84), and off the seed
runner and platform (``../shared/seeds``). The kernel's table must cover each of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import BaseModel, Field

from ascend_kernel.errors import SettingsError
from ascend_kernel.settings import ENV_PREFIX, load_settings
from ascend_kernel_plugins.eplb.settings import EplbSettings
from ascend_kernel_plugins.moe_comm.settings import MoECommSettings
from ascend_kernel_plugins.tp_comm import TpCommSettings
from ascend_kernel_plugins.vllm_ascend_keys import doc, plugin, translate
from ascend_kernel_plugins.vllm_ascend_keys.envs import ENVS
from ascend_kernel_plugins.vllm_ascend_keys.keys import KEYS, PASSED
from ascend_kernel_plugins.vllm_ascend_keys.rules import Honored, Off, Passed, Refused, Section, Setting

REPO = Path(__file__).resolve().parents[1]

V0_23_0 = """SLO_limits_for_dynamic_batch ascend_compilation_config ascend_fusion_config ascend_log_path
c8_enable_reshape_optim dp_allreduce_on_npu dump_config dump_config_path enable_async_exponential
enable_balance_scheduling enable_cpu_binding enable_flashcomm1 enable_flashcomm2_parallel_size enable_fused_mc2
enable_kv_nz enable_matmul_allreduce enable_mc2_hierarchy_comm enable_mlapo enable_prefill_mc2 enable_reduce_sample
enable_shared_expert_dp enable_sleep_mode_extra_cleanup enable_sparse_li_c8 enable_sparse_sfa_c8
enable_transpose_kv_cache_by_block eplb_config finegrained_tp_config hamming_sparse layer_sharding
mega_moe_max_tokens mix_placement msmonitor_use_daemon multistream_dsv4_dsa_overlap multistream_overlap_gate
multistream_overlap_shared_expert pa_shape_list profiling_chunk_config recompute_scheduler_enable
rejection_sampler_config weight_nz_mode weight_prefetch_config xlite_graph_config refresh enable_dsa_cp
enable_hamming_sparse""".split()
MAIN = """ascend_compilation_config ascend_fusion_config ascend_log_path c8_enable_reshape_optim dump_config
dump_config_path dynamic_spec_config enable_cpu_binding enable_fused_mc2 enable_kv_nz enable_mc2_hierarchy_comm
enable_mlapo enable_prefill_mc2 enable_reduce_sample enable_shared_expert_dp enable_sparse_li_c8 enable_sparse_sfa_c8
enable_transpose_kv_cache_by_block eplb_config finegrained_tp_config mega_moe_max_tokens mix_placement
msmonitor_use_daemon multistream_dsv4_dsa_overlap multistream_overlap_shared_expert pa_shape_list
rejection_sampler_config rl_config sparse_kv_offload_config weight_nz_mode xlite_graph_config scheduler_config
enable_flashcomm1 enable_sleep_mode_extra_cleanup refresh enable_dsa_cp draft_window_size short_request_first_config
batch_job_sched_config profiling_chunk_config""".split()
SEED = """torchair_graph_config ascend_scheduler_config xlite_graph_config ascend_compilation_config
ascend_fusion_config finegrained_tp_config eplb_config enable_kv_nz enable_shared_expert_dp
multistream_overlap_shared_expert enable_prefill_mc2 enable_reduce_sample recompute_scheduler_enable
SLO_limits_for_dynamic_batch enable_mc2_hierarchy_comm weight_prefetch_config dynamic_eplb expert_map_record_path
eplb_policy_type kv_cache_dtype enable_weight_nz_layout""".split()
ENV_NAMES = """VLLM_ASCEND_ENABLE_PREFETCH_MLP VLLM_ASCEND_ENABLE_TOPK_TOPP_OPTIMIZATION VLLM_ASCEND_ENABLE_DBO
VLLM_ASCEND_ENABLE_FUSED_MC2 VLLM_ASCEND_ENABLE_VNPU VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE VLLM_ASCEND_ENABLE_FLASHCOMM1
VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE MSMONITOR_USE_DAEMON VLLM_ASCEND_ENABLE_MLAPO VLLM_ASCEND_ENABLE_NZ DYNAMIC_EPLB
VLLM_ASCEND_BALANCE_SCHEDULING VLLM_ASCEND_FUSION_OP_TRANSPOSE_KV_CACHE_BY_BLOCK VLLM_ASCEND_ENABLE_BATCH_MEMCPY
VLLM_ASCEND_TRACE_RECOMPILES VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE VLLM_ASCEND_KV_CACHE_MEGABYTES_FLOATING_TOLERANCE
VLLM_ASCEND_LLMDD_RPC_IP VLLM_ASCEND_LLMDD_RPC_PORT VLLM_ASCEND_MLA_PA VLLM_ASCEND_MLP_GATE_UP_PREFETCH_SIZE
VLLM_ASCEND_MLP_DOWN_PREFETCH_SIZE VLLM_ASCEND_ENABLE_DENSE_OPTIMIZE VLLM_ASCEND_ENABLE_MLP_OPTIMIZE
VLLM_ASCEND_KVCACHE_DELAY_FREE_TIMEOUT VLLM_ASCEND_ENABLE_CONTEXT_PARALLEL""".split()


class FusionSettings(BaseModel):
    """A stand-in for the fusion plugin's declared settings (only their names and types matter here)."""

    fuse_norm_quant: bool = Field(True, description="x")
    fuse_qknorm_rope: bool = Field(True, description="x")
    fuse_muls_add: bool = Field(True, description="x")


KEYS_PLUGIN = ("vllm-ascend-keys", plugin.VllmAscendKeysSettings)
WITH_FUSION = [KEYS_PLUGIN, ("moe-comm", MoECommSettings), ("eplb", EplbSettings), ("fusion", FusionSettings)]
WITHOUT_FUSION = WITH_FUSION[:-1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith((ENV_PREFIX, "VLLM_ASCEND_")) or key in ENVS:
            monkeypatch.delenv(key)


def refused(config, declared=WITHOUT_FUSION) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(config, declared=declared)
    return str(info.value)


# -- the table covers vllm-ascend ---------------------------------------------------------------


@pytest.mark.parametrize("release", ["v0.23.0", "main", "seed"])
def test_every_key_of_vllm_ascend_has_a_rule(release):
    listed = {"v0.23.0": V0_23_0, "main": MAIN, "seed": SEED}[release]
    assert sorted(set(listed) - set(KEYS)) == []


def test_every_variable_of_vllm_ascend_has_a_rule():
    assert sorted(set(ENV_NAMES) - set(ENVS)) == []


def _leaves(rule, path):
    if isinstance(rule, Section):
        for key, sub in rule.keys.items():
            yield from _leaves(sub, f"{path}.{key}")
    else:
        yield path, rule


def _nest(path: str, value):
    head, _, rest = path.partition(".")
    return {head: _nest(rest, value) if rest else value}


ALL_LEAVES = [leaf for name, (rule, _) in KEYS.items() for leaf in _leaves(rule, name)]


@pytest.mark.parametrize(("path", "rule"), ALL_LEAVES, ids=[p for p, _ in ALL_LEAVES])
def test_each_key_is_honored_when_off_and_refused_by_name_when_on(path, rule):
    """Through load_settings, the way an engine's start-up reads them (the fusion settings not installed)."""
    where = "additional_config" + "".join(f'["{p}"]' for p in path.split("."))
    on = 7 if path.endswith(("_interval", "redundant_experts")) else True
    if isinstance(rule, (Off, Refused)) or (isinstance(rule, Setting) and rule.setting.startswith("fuse_")):
        config = _nest(path, on)
        if path == "eplb_config.eplb_policy_type":  # a policy matters only where dynamic EPLB runs
            config["eplb_config"]["dynamic_eplb"] = True
        message = refused(config)
        assert f"{where}=" in message and "is refused" in message and "Instead:" in message
        assert message.count("is refused") == 1  # one key, one paragraph
    if isinstance(rule, (Off, Honored)) or isinstance(rule, Setting) and rule.off_without:
        off = "all" if path.endswith(("_stage", "_phase")) else -1 if path.startswith("SLO") else False
        if isinstance(rule, Setting) and rule.setting.startswith("eplb_config."):
            off = 0
        if path.endswith(("_map_path", "_map_record_path")):
            off = None  # no file: vllm-ascend's default
        load_settings(_nest(path, off), declared=WITHOUT_FUSION)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_each_variable_off_is_honored_and_on_is_refused_or_mapped(monkeypatch, name):
    rule = ENVS[name][0]
    monkeypatch.setenv(name, "0")
    if not isinstance(rule, Refused):
        load_settings(declared=WITHOUT_FUSION + [("sampling", _Sampling)])
    monkeypatch.setenv(name, "1")
    if isinstance(rule, Setting) and rule.setting == "enable_topk_topp_optimization":
        assert load_settings(declared=WITHOUT_FUSION + [("sampling", _Sampling)]).enable_topk_topp_optimization
        return
    with pytest.raises(SettingsError, match=f"{name}='1' is refused"):
        load_settings(declared=WITHOUT_FUSION + [("sampling", _Sampling)])


class _Sampling(BaseModel):
    enable_topk_topp_optimization: bool = Field(False, description="x")


# -- the example and did-you-mean -----------------------------------------------------------


def test_a_migrated_launch_command_is_refused_key_by_key():
    message = refused({"torchair_graph_config": {"enabled": True}, "ascend_scheduler_config": {"enabled": True},
                       "enable_weight_nz_layout": True})
    for key in ('["torchair_graph_config"]["enabled"]=True', '["ascend_scheduler_config"]["enabled"]=True',
                '["enable_weight_nz_layout"]=True'):
        assert f"additional_config{key} is refused" in message
    assert "ASCEND_KERNEL_GRAPH_MODE" in message and "enable_chunked_prefill=false" in message


def test_a_disabled_section_with_its_other_sub_keys_is_honored():
    load_settings({"torchair_graph_config": {"enabled": False, "graph_batch_sizes": [1, 2]},
                   "xlite_graph_config": {"enabled": False, "full_mode": True}}, declared=WITHOUT_FUSION)


#: every sub-key vllm-ascend's config classes read on main (182b75ea84, ascend_config.py), at its default value;
#: but ``enable_npugraph_ex``, on by default there: written out, on asks for a backend the kernel lacks (refused by
#: name, as are the top-level ``enable_cpu_binding`` and ``multistream_dsv4_dsa_overlap``, also on by default)
MAIN_DEFAULTS = {
    "rl_config": {"enabled": False, "sleep_mode_extra_cleanup": False, "enable_training_consistency": False,
                  "enable_batch_invariant": False},
    "dynamic_spec_config": {"method": None, "method_params": {}},
    "finegrained_tp_config": dict.fromkeys(("oproj_tensor_parallel_size", "lmhead_tensor_parallel_size",
                                            "embedding_tensor_parallel_size", "mlp_tensor_parallel_size",
                                            "olora_tensor_parallel_size"), 0),
    "ascend_compilation_config": {"enable_npugraph_ex": False, "enable_static_kernel": False,
                                  "fuse_norm_quant": True, "fuse_qknorm_rope": True, "fuse_muls_add": True},
    "xlite_graph_config": {"enabled": False, "full_mode": False},
    "rejection_sampler_config": {"enable_block_verify": False, "enable_entropy_verify": False,
                                 "posterior_threshold": 0.95, "posterior_alpha": 0.4},
    "eplb_config": {"dynamic_eplb": False, "expert_map_path": None, "expert_heat_collection_interval": 600,
                    "algorithm_execution_interval": 50, "expert_map_record_path": None, "num_redundant_experts": 0,
                    "eplb_policy_type": 2, "eplb_heat_collection_stage": "all", "load_collection_phase": "all"},
    "sparse_kv_offload_config": {"enabled": False, "topk_buffer_size": 4096, "dram_size_per_dp_GB": 128,
                                 "keep_device_kv_cache": False},
    "scheduler_config": {
        "enable_balance_scheduling": False, "recompute_scheduler_enable": False,
        "short_request_first_config": {"enabled": False, "threshold": 256, "long_max_wait_ms": 0.0},
        "profiling_chunk_config": {"enabled": False, "smooth_factor": 1.0, "min_chunk": 4096, "need_timing": False,
                                   "max_fit_chunk": 30},
        "batch_job_sched_config": {"enabled": False, "max_jobs": 20, "reserve_margin_blocks": 2,
                                   "reserve_max_blocks": 8, "low_available_tokens_threshold": 4096,
                                   "short_decode_token_threshold": 32},
        "dyntra_lb_config": {"enabled": False, "enable_diagnostics": False, "mode": "dynamic", "start_step": 250,
                             "end_step": -1, "bubble_threshold": 5.0, "long_req_block_threshold": 700,
                             "dynamic_max_step": 256}},
}


@pytest.mark.parametrize("section", sorted(MAIN_DEFAULTS))
def test_vllm_ascends_defaults_written_out_are_honored(section):
    """A launch command that spells out vllm-ascend's defaults asks for nothing the kernel lacks: every sub-key,
    nested ones too, is known and honored (found: batch_job_sched_config's and dyntra_lb_config's tuning keys, two
    rl_config switches, a null expert-map path, the default policy type and lm-head TP's 0 were refused), with the
    plugins that declare the settings they map onto (the installed ones, as a user runs it)."""
    load_settings({section: MAIN_DEFAULTS[section]})


def test_main_still_reads_two_scheduling_sections_at_the_top_level():
    scheduling = MAIN_DEFAULTS["scheduler_config"]
    load_settings({key: scheduling[key] for key in ("short_request_first_config", "batch_job_sched_config",
                                                    "profiling_chunk_config")}, declared=WITHOUT_FUSION)
    message = refused({"batch_job_sched_config": {"enabled": True, "max_jobs": 3}})
    assert 'additional_config["batch_job_sched_config"]["enabled"]=True is refused' in message
    assert "max_jobs" not in message  # an enabled section's refusal says it all


def test_the_policy_type_is_refused_only_where_dynamic_eplb_runs():
    message = refused({"eplb_config": {"dynamic_eplb": True, "eplb_policy_type": 2}})
    assert '["eplb_policy_type"]=2 is refused' in message and '"policy": NAME' in message
    load_settings({"eplb_config": {"dynamic_eplb": False, "eplb_policy_type": 3}}, declared=WITHOUT_FUSION)
    assert "is refused" in refused({"eplb_config": {"eplb_policy_type": 2}})  # the kernel's own switch may be on
    off = load_settings({"eplb_config": {"dynamic_eplb": False, "expert_heat_collection_interval": 60,
                                         "num_redundant_experts": 0, "load_collection_phase": "decode"}})
    assert off.enable_eplb is False and not off.eplb_config  # nothing mapped for an EPLB that is off
    assert "is refused" in refused({"eplb_config": {"dynamic_eplb": False, "expert_map_path": "/x.json"}})
    message = refused({"eplb_config": {"expert_map_path": "/x.json"}})
    assert "ASCEND_KERNEL_EPLB_REPLAY_PATH" in message


def test_lm_head_tp_zero_is_off_as_in_vllm_ascend():
    installed = load_settings({"finegrained_tp_config": {"lmhead_tensor_parallel_size": 0}})
    assert installed.lmhead_tensor_parallel_size is None
    assert load_settings({"finegrained_tp_config": {"lmhead_tensor_parallel_size": 2}}).lmhead_tensor_parallel_size == 2
    message = refused({"finegrained_tp_config": {"lmhead_tensor_parallel_size": -1}}, declared=None)
    assert "is refused: not a value of lmhead_tensor_parallel_size (-1 is below 0)" in message


@pytest.mark.parametrize(("config", "needle"), [
    ({"torchair_graph_confg": {"enabled": True}}, "did you mean 'torchair_graph_config'?"),
    ({"enable_kv_zn": False}, "did you mean 'enable_kv_nz'?"),
    ({"torchair_graph_config": {"enabeld": False}}, "did you mean 'enabled'?"),
    ({"eplb_config": {"num_redundant_expert": 1}}, "did you mean 'num_redundant_experts'?"),
    ({"ascend_compilation_config": {"fuse_norm_qant": True}}, "did you mean 'fuse_norm_quant'?"),
])
def test_an_unknown_key_at_any_level_gets_did_you_mean(config, needle):
    message = refused(config)
    assert needle in message and "docs/vllm-ascend-config.md" in message


def test_an_unknown_vllm_ascend_variable_gets_did_you_mean(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_ENABEL_NZ", "0")
    message = refused(None)
    assert "VLLM_ASCEND_ENABEL_NZ='0' is no variable vllm-ascend reads (did you mean 'VLLM_ASCEND_ENABLE_NZ'?)" \
        in message


def test_vllms_and_the_kernels_own_keys_pass():
    settings = load_settings({"gdn_prefill_backend": "auto", "ascend_kernel": {"mc2_min_world_size": 4},
                              "ascend_kernel_config_changes": []}, declared=WITHOUT_FUSION)
    assert settings.mc2_min_world_size == 4
    assert set(PASSED) >= {"ascend_kernel", "kda_prefill_backend"}


# -- mapped onto kernel settings -------------------------------------------------------------------


def test_compilation_fusions_map_onto_the_fusion_settings_when_declared():
    settings = load_settings({"ascend_compilation_config": {"fuse_norm_quant": False, "fuse_qknorm_rope": True,
                                                            "fuse_muls_add": 0}}, declared=WITH_FUSION)
    assert (settings.fuse_norm_quant, settings.fuse_qknorm_rope, settings.fuse_muls_add) == (False, True, False)


def test_compilation_fusions_without_a_fusion_plugin_honor_off_and_refuse_on():
    load_settings({"ascend_compilation_config": {"fuse_norm_quant": False}}, declared=WITHOUT_FUSION)
    message = refused({"ascend_compilation_config": {"fuse_qknorm_rope": True}})
    assert 'additional_config["ascend_compilation_config"]["fuse_qknorm_rope"]=True is refused' in message
    assert "kernel setting fuse_qknorm_rope" in message


def test_eplb_config_maps_onto_the_eplb_plugins_settings():
    settings = load_settings({"eplb_config": {"dynamic_eplb": True, "num_redundant_experts": 2,
                                              "expert_heat_collection_interval": 4, "algorithm_execution_interval": 3,
                                              "eplb_heat_collection_stage": "all"}}, declared=WITHOUT_FUSION)
    assert settings.enable_eplb is True
    import json

    assert json.loads(settings.eplb_config) == {"num_redundant_experts": 2, "window_size": 4, "step_interval": 7}
    message = refused({"eplb_config": {"expert_map_path": "/x.json", "eplb_heat_collection_stage": "decode"}})
    assert "ASCEND_KERNEL_EPLB_REPLAY_PATH" in message and '["eplb_heat_collection_stage"]=\'decode\'' in message


def test_a_key_no_installed_plugin_implements_is_refused_under_vllm_ascends_name():
    """Without the tp-comm plugin (nothing declares sequence_parallel) enable_flashcomm1 on is refused, off is
    honored; with it, the key is the plugin's setting (an engine then runs sequence parallelism: tests/e2e)."""
    message = refused({"enable_flashcomm1": True})
    assert 'additional_config["enable_flashcomm1"]=True is refused' in message and "sequence parallelism" in message
    assert '["ascend_kernel"]' not in message
    assert not hasattr(load_settings({"enable_flashcomm1": False}, declared=WITHOUT_FUSION), "sequence_parallel")
    with_tp_comm = [*WITHOUT_FUSION, ("tp-comm", TpCommSettings)]
    assert load_settings({"enable_flashcomm1": True}, declared=with_tp_comm).sequence_parallel is True
    assert load_settings({"enable_flashcomm1": "0"}, declared=with_tp_comm).sequence_parallel is False


def test_enable_flashcomm1_is_honored_by_the_installed_plugins_and_recorded():
    settings = load_settings({"enable_flashcomm1": True})
    assert settings.sequence_parallel is True
    config = SimpleNamespace(additional_config={"enable_flashcomm1": True})
    (change,) = [c for c in plugin.ascend_kernel_configure(settings, config) if "flashcomm" in c.path]
    assert change.path == "additional_config.enable_flashcomm1" and change.new == "setting sequence_parallel=True"


def test_the_key_wins_over_the_variable_it_replaces(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_FUSED_MC2", "1")
    assert load_settings({"enable_fused_mc2": 0}, declared=WITHOUT_FUSION).enable_fused_mc2 is False


def test_the_eplb_switch_vllm_ascend_requires_beside_dynamic_eplb_is_honored(monkeypatch):
    monkeypatch.setenv("DYNAMIC_EPLB", "true")
    assert load_settings({"eplb_config": {"dynamic_eplb": True}}, declared=WITHOUT_FUSION).enable_eplb is True
    message = refused({"eplb_config": {"dynamic_eplb": False}})
    assert "DYNAMIC_EPLB='true' is refused" in message and "eplb_config" in message


def test_one_setting_given_two_ways_must_agree(monkeypatch):
    message = refused({"eplb_config": {"dynamic_eplb": True}, "ascend_kernel": {"enable_eplb": False}})
    assert "enable_eplb is given twice" in message
    load_settings({"eplb_config": {"dynamic_eplb": True}, "ascend_kernel": {"enable_eplb": True}},
                  declared=WITHOUT_FUSION)
    monkeypatch.setenv("ASCEND_KERNEL_FUSE_NORM_QUANT", "1")
    message = refused({"ascend_compilation_config": {"fuse_norm_quant": False}}, declared=WITH_FUSION)
    assert "ASCEND_KERNEL_FUSE_NORM_QUANT" in message


# -- recorded, documented ---------------------------------------------------------------------------


def test_honored_keys_are_recorded_as_config_changes(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_MLAPO", "0")
    config = {"enable_kv_nz": False, "refresh": True, "ascend_kernel": {}}
    settings = load_settings(config, declared=WITH_FUSION)
    changes = plugin.ascend_kernel_configure(settings, SimpleNamespace(additional_config=config))
    by_path = {c.path: c for c in changes}
    assert set(by_path) == {"additional_config.enable_kv_nz", "additional_config.refresh", "VLLM_ASCEND_ENABLE_MLAPO"}
    assert "NZ-format KV cache" in by_path["additional_config.enable_kv_nz"].new
    assert by_path["VLLM_ASCEND_ENABLE_MLAPO"].old == "0"


def test_the_translation_is_the_same_in_every_process():
    config = {"eplb_config": {"dynamic_eplb": True, "num_redundant_experts": 1}}
    fields = plugin.implemented(plugin.VllmAscendKeysSettings)
    assert translate(config, {}, fields | {"enable_eplb", "eplb_config"}).settings == \
        translate(dict(config), {}, fields | {"enable_eplb", "eplb_config"}).settings


def test_the_committed_page_is_what_the_rules_generate():
    page = REPO / "docs" / "vllm-ascend-config.md"
    assert page.read_text() == doc.markdown(), \
        "docs/vllm-ascend-config.md is out of date: python -m ascend_kernel_plugins.vllm_ascend_keys.doc > it"
    for name in [*KEYS, *ENVS, *PASSED]:
        assert f"| `{name}` |" in page.read_text()


def test_explain_refuses_a_vllm_ascend_launch_before_any_engine(tmp_path):
    """Each refused key is a line of its own under the headline (the message's paragraphs, not run together)."""
    (tmp_path / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    env.update(ASCEND_KERNEL_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "ascend_kernel.cli.main", "explain", "--model", str(tmp_path),
                           "--additional-config",
                           '{"torchair_graph_config": {"enabled": true}, "enable_weight_nz_layout": true}'],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    headline, torchair, nz = proc.stderr.strip().splitlines()[-3:]
    assert headline.startswith("ascend-kernel: error: vllm-ascend configuration the kernel does not run")
    assert torchair.startswith('additional_config["torchair_graph_config"]["enabled"]=True is refused')
    assert "TorchAir" in torchair and "ASCEND_KERNEL_GRAPH_MODE" in torchair
    assert nz.startswith('additional_config["enable_weight_nz_layout"]=True is refused')
    assert "Resolved architecture" not in proc.stderr  # refused before vLLM read the model

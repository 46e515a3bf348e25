"""A bad ``--kv-transfer-config`` is one kernel paragraph naming the flag, the problem and what is allowed.

The checker itself, then ``ascend-kernel serve``'s own parser (vLLM's serve
parser with the kernel's check on the flag), then one real ``serve`` process
that must stop before vLLM reads the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_kernel_plugins.kv_transfer.config_check import KVTransferConfigError, check_kv_transfer_config

REPO = Path(__file__).resolve().parents[1]


def mooncake(role: str = "kv_producer", **extra: str) -> str:
    config = {"kv_connector": "MooncakeConnector", "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


#: flag value -> what the paragraph must say (besides the flag and the value)
BAD = {
    "invalid-json": ('{"kv_connector": MooncakeConnector}', ["is not valid JSON", "at character 17",
                                                              "allowed: a JSON object such as"]),
    "not-an-object": ('["MooncakeConnector"]', ["is a JSON list, not an object"]),
    "unknown-connector": (json.dumps({"kv_connector": "MoonCakeConnector", "kv_role": "kv_producer"}),
                          ["kv_connector='MoonCakeConnector' is not a connector vLLM knows", "MooncakeConnector,",
                           "NixlConnector", "kv_connector_module_path"]),
    "bad-role": (mooncake("kv_prefill"), ["kv_role='kv_prefill' is not a role",
                                          "allowed: 'kv_producer', 'kv_both', 'kv_consumer'"]),
    "missing-role": (json.dumps({"kv_connector": "MooncakeConnector"}), ["kv_role is missing"]),
    "bad-protocol": (mooncake(mooncake_protocol="tpc"), ["mooncake_protocol='tpc' is not a Mooncake transport",
                                                         "silently fall back to TCP", "allowed: 'tcp', 'rdma'"]),
    "unknown-key": (json.dumps({"kv_conector": "MooncakeConnector", "kv_role": "kv_both"}),
                    ["unknown key 'kv_conector'", "allowed keys: kv_connector, engine_id"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_checker_names_flag_value_problem_and_allowed(case):
    text, needles = BAD[case]
    with pytest.raises(KVTransferConfigError) as info:
        check_kv_transfer_config(text)
    message = str(info.value)
    assert message.startswith(f"--kv-transfer-config {text!r} ")
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_every_problem_is_reported_at_once():
    text = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "both", "kv_connector_extra_config":
                       {"mooncake_protocol": "udp"}, "kv_prot": 1})
    with pytest.raises(KVTransferConfigError) as info:
        check_kv_transfer_config(text)
    message = str(info.value)
    assert "unknown key 'kv_prot'" in message and "kv_role='both'" in message and "'udp'" in message


@pytest.mark.parametrize("text", [mooncake(), mooncake("kv_consumer", mooncake_protocol="tcp"),
                                  mooncake("kv_both", mooncake_protocol="rdma"),
                                  json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
                                  json.dumps({"kv_connector": "Mine", "kv_role": "kv_both",
                                              "kv_connector_module_path": "my.module"})])
def test_good_configs_pass_unchanged(text):
    assert check_kv_transfer_config(text) == json.loads(text)


def test_serve_parser_refuses_before_vllm_converts_and_passes_good_values(tmp_path):
    """``serve``'s parser raises the kernel's error (not argparse's SystemExit) and keeps vLLM's conversion."""
    from vllm.config import KVTransferConfig

    from ascend_kernel.cli.serve import build_parser

    root, _ = build_parser()
    for case in ("invalid-json", "bad-role", "unknown-connector", "bad-protocol"):
        with pytest.raises(KVTransferConfigError, match="--kv-transfer-config"):
            root.parse_args(["serve", "M", "--kv-transfer-config", BAD[case][0]])
    # vLLM's other spellings go through the same action
    with pytest.raises(KVTransferConfigError, match="kv_role='x'"):
        root.parse_args(["serve", "M", f"--kv_transfer_config={mooncake('x')}"])
    with pytest.raises(KVTransferConfigError, match="kv_role='y'"):
        root.parse_args(["serve", "M", "--kv-transfer-config.kv_connector", "MooncakeConnector",
                         "--kv-transfer-config.kv_role", "y"])
    config_file = tmp_path / "serve.yaml"
    config_file.write_text("kv-transfer-config:\n  kv_connector: MooncakeConnector\n  kv_role: z\n")
    with pytest.raises(KVTransferConfigError, match="kv_role='z'"):
        root.parse_args(["serve", "M", "--config", str(config_file)])
    args = root.parse_args(["serve", "M", "--kv-transfer-config", mooncake("kv_consumer", mooncake_protocol="tcp")])
    assert isinstance(args.kv_transfer_config, KVTransferConfig)
    assert args.kv_transfer_config.kv_role == "kv_consumer"


def test_serve_stops_with_one_paragraph_before_reading_the_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ASCEND_KERNEL_")}
    proc = subprocess.run([sys.executable, "-m", "ascend_kernel.cli.main", "serve", str(tmp_path), "--port", "0",
                           "--kv-transfer-config", BAD["bad-protocol"][0]], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("ascend-kernel: error: --kv-transfer-config "), proc.stderr
    assert "mooncake_protocol='tpc'" in errors[0] and "allowed: 'tcp', 'rdma'" in errors[0]
    assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr and "validation error" not in proc.stderr
    assert "Resolved architecture" not in proc.stderr and proc.stdout == ""  # vLLM never read the model

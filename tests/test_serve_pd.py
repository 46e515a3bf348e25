"""``ascend-kernel serve-pd`` without engines: the instances it would start, and what it refuses."""

from __future__ import annotations

import argparse
import json

import pytest

from ascend_kernel.cli.serve_pd import build_instances, build_parser, main


def test_instances_roles_ports_and_cores(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    args, rest = build_parser().parse_known_args(["M", "--prefill", "2", "--decode", "1", "--dtype", "float32",
                                                  "--api-key", "k"])
    servers = build_instances(args, rest, tmp_path)
    configs = [json.loads(s.argv[s.argv.index("--kv-transfer-config") + 1]) for s in servers]
    assert [c["kv_role"] for c in configs] == ["kv_producer", "kv_producer", "kv_consumer"]
    assert all(c["kv_connector"] == "MooncakeConnector" and c["kv_connector_extra_config"] == {"mooncake_protocol":
                                                                                               "tcp"} for c in configs)
    assert all(s.argv[3:6] == ["serve", "M", "--dtype"] and s.api_key == "k" and not s.new_session for s in servers)
    boot = [s.env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT") for s in servers]
    assert boot[2] is None and boot[0] and boot[1] and boot[0] != boot[1]  # a bootstrap server per producer
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in servers] == ["0", "1", "0"]
    assert len({s.port for s in servers}) == 3
    assert [s.log_path.name for s in servers] == ["prefill0.log", "prefill1.log", "decode0.log"]


def test_refusals_before_anything_starts(tmp_path, capsys):
    assert main(["M", "--log-dir", str(tmp_path), "--kv-transfer-config", "{}"]) == 2
    assert "--kv-transfer-config is set by ascend-kernel serve-pd" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        build_parser().parse_args(["M", "--prefill", "0"])
    with pytest.raises(argparse.ArgumentTypeError):
        from ascend_kernel.cli.serve_pd import _positive

        _positive("-1")


@pytest.mark.parametrize(("argv", "needles"), [
    (["--mooncake-protocol", "tpc"], ["--mooncake-protocol='tpc' is not a Mooncake transport", "allowed: 'tcp', 'rdma'",
                                      "nothing was started"]),
    (["--kv_transfer_config={}"], ["--kv-transfer-config is set by ascend-kernel serve-pd", "--mooncake-protocol"]),
])
def test_a_bad_transfer_setting_is_one_paragraph_and_starts_nothing(tmp_path, capsys, argv, needles):
    assert main(["M", "--log-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ascend-kernel serve-pd: error: "), err
    for needle in needles:
        assert needle in err
    assert not any(tmp_path.iterdir())


def test_tensor_parallel_per_role(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    args, rest = build_parser().parse_known_args(["M", "--prefill-tp", "2", "--decode", "2"])
    servers = build_instances(args, rest, tmp_path)

    def tp(server):
        argv = server.argv
        return int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1

    assert [tp(s) for s in servers] == [2, 1, 1]
    # one core per rank, in turn: the TP=2 prefill binds both, the decodes take the next ones (wrapping)
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in servers] == ["0|1", "0", "1"]


@pytest.mark.parametrize("flag", [["--tensor-parallel-size", "2"], ["-tp", "2"], ["--tensor_parallel_size=2"]])
def test_a_tensor_parallel_flag_for_every_instance_is_refused(tmp_path, capsys, flag):
    assert main(["M", "--log-dir", str(tmp_path), *flag]) == 2
    err = capsys.readouterr().err
    assert "--prefill-tp and --decode-tp" in err and "nothing was started" in err
    assert not any(tmp_path.iterdir())

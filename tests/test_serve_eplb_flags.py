"""``ascend-kernel serve --enable-eplb --eplb-config ...`` reaches the EPLB plugin, not vLLM's refusal.

vLLM's ParallelConfig refuses EPLB off CUDA/XPU before any platform hook
runs; ``serve`` hands both flags to the EPLB plugin's settings (the kernel's
section of ``additional_config``), as ``generate`` does, and clears vLLM's own.
"""

from __future__ import annotations

from ascend_kernel.cli.serve import build_parser, eplb_into_settings


def parse(*argv: str):
    root, _ = build_parser()
    args = root.parse_args(["serve", "m", *argv])
    eplb_into_settings(args, argv)
    return args


def test_enable_eplb_and_its_config_move_to_the_kernels_section():
    args = parse("--enable-eplb", "--eplb-config", '{"window_size": 4, "step_interval": 8}',
                 "--additional-config", '{"other": 1}')
    assert args.enable_eplb is False
    section = args.additional_config["ascend_kernel"]
    assert section["enable_eplb"] is True
    assert section["eplb_config"]["window_size"] == 4 and section["eplb_config"]["step_interval"] == 8
    assert args.additional_config["other"] == 1


def test_without_the_flag_nothing_moves():
    args = parse("--eplb-config", '{"window_size": 4}')
    assert args.enable_eplb is False and "ascend_kernel" not in (args.additional_config or {})
    only = parse("--enable-eplb")
    assert only.additional_config["ascend_kernel"] == {"enable_eplb": True}

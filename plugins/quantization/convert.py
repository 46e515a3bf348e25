"""msModelSlim (``ascend``) int8 checkpoints to compressed-tensors int8, losslessly.

Why: stock vLLM-CPU runs compressed-tensors int8 W8A8 on oneDNN, so the same
int8 weights in that format are an oracle for the kernel's ``ascend`` path
(``ascend-kernel quant-convert``; the e2e tests compare greedy tokens). No
weight is requantized: int8 weights are copied, and the scales are the
ones msModelSlim computed, in compressed-tensors' terms:

* W8A8_DYNAMIC: ``weight_scale`` as is; activations per token, symmetric.
* W8A8 (static): per-channel ``weight_scale = deq_scale / input_scale``;
  activations per tensor with ``input_scale`` and ``input_zero_point =
  input_offset``; the bias msModelSlim folded into ``quant_bias`` (beyond the
  zero-point correction, which compressed-tensors kernels compute themselves)
  becomes the float bias ``codes * deq_scale``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ascend_kernel_plugins.quantization.description import QuantizationError
from ascend_kernel.ops.quant_ops import float32_bits_to_scale
from ascend_kernel_plugins.quantization.description import DESCRIPTION_FILE, Description
from ascend_kernel_plugins.quantization.schemes import FLOAT, W8A8, W8A8_DYNAMIC

_WEIGHTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
_ACTIVATIONS = {
    W8A8_DYNAMIC: {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
    W8A8: {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "tensor", "dynamic": False},
}
_ASCEND_ONLY = ("weight_offset", "deq_scale", "quant_bias", "input_offset")


def to_compressed_tensors(src: str | Path, dst: str | Path) -> dict[str, Any]:
    """Write ``dst``: the model of ``src`` in compressed-tensors int8; returns what was converted, per scheme."""
    src, dst = Path(src), Path(dst)
    description = Description.from_dir(src)
    description.check_types()
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(path))
    layers: dict[str, list[str]] = {W8A8: [], W8A8_DYNAMIC: []}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        kind = description.weight_type(prefix)
        if kind in (None, FLOAT) or suffix == "bias":
            out.setdefault(name, tensor)
            continue
        if suffix != "weight":
            continue  # written with the weight below
        layers[kind].append(prefix)
        out[name] = tensor
        if kind == W8A8_DYNAMIC:
            out[f"{prefix}.weight_scale"] = tensors[f"{prefix}.weight_scale"].to(torch.float32).reshape(-1, 1)
            continue
        deq = float32_bits_to_scale(tensors[f"{prefix}.deq_scale"].reshape(-1))
        input_scale = tensors[f"{prefix}.input_scale"].to(torch.float32).reshape(1)
        offset = tensors[f"{prefix}.input_offset"].to(torch.float32).reshape(1)
        out[f"{prefix}.weight_scale"] = (deq / input_scale).reshape(-1, 1)
        out[f"{prefix}.input_scale"] = input_scale
        out[f"{prefix}.input_zero_point"] = offset.round().to(torch.int8)
        codes = tensors[f"{prefix}.quant_bias"].to(torch.int64) + offset.round().to(torch.int64) * \
            tensor.to(torch.int64).sum(dim=1)
        if f"{prefix}.bias" in tensors:
            out[f"{prefix}.bias"] = codes.to(torch.float32) * deq
        elif bool(codes.ne(0).any()):
            raise QuantizationError(f"layer {prefix!r}: its quant_bias holds a bias but the checkpoint has no "
                                    f"{prefix}.bias for compressed-tensors to carry it")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _ct_config(layers)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for item in src.iterdir():  # tokenizer, generation config, chat template...
        if item.is_file() and item.suffix != ".safetensors" and item.name not in (
                "config.json", DESCRIPTION_FILE) and not item.name.endswith(".safetensors.index.json"):
            shutil.copy2(item, dst / item.name)
    return {kind: len(prefixes) for kind, prefixes in layers.items()}


def _ct_config(layers: dict[str, list[str]]) -> dict[str, Any]:
    groups = {}
    for i, (kind, prefixes) in enumerate(sorted((k, v) for k, v in layers.items() if v)):
        groups[f"group_{i}"] = {"targets": [f"re:^{re.escape(p)}$" for p in sorted(prefixes)],
                                "weights": dict(_WEIGHTS), "input_activations": dict(_ACTIVATIONS[kind])}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": groups, "ignore": []}


def main(argv: list[str] | None = None) -> int:
    """``python -m ascend_kernel_plugins.quantization.convert SRC DST``: write DST in compressed-tensors int8."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="an msModelSlim checkpoint directory (with quant_model_description.json)")
    parser.add_argument("dst", help="the directory to write")
    args = parser.parse_args(argv)
    try:
        counts = to_compressed_tensors(args.src, args.dst)
    except QuantizationError as exc:
        print(f"error: {exc}", flush=True)
        return 2
    print(json.dumps({"out": args.dst, "layers": counts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

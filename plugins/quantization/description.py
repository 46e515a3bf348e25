"""Reading and checking an msModelSlim checkpoint: its description and the tensors it promises.

Everything is checked once, in the process that builds the engine's config,
before any weight is read: a description that names a type the kernel does
not serve, a quantized weight whose scales are missing or mis-shaped, or a
weight that is not int8 stops start-up with one :class:`QuantizationError`
that names the tensor and what is allowed. Only the safetensors headers are
read (shapes and dtypes), never the data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ascend_kernel.errors import KernelError
from ascend_kernel_plugins.quantization.schemes import EXPERT_SCHEMES, FLOAT, ROWS_PER_BYTE, SERVED_TYPES, TENSORS

DESCRIPTION_FILE = "quant_model_description.json"


class QuantizationError(KernelError):
    """A quantized checkpoint cannot be served as it is (names the layer or tensor, and what is allowed)."""

#: description keys that are not tensors
_META_KEYS = ("version", "model_quant_type", "metadata", "group_size", "optional", "kv_cache_type", "fa_quant_type",
              "reduce_quant_type")


@dataclass(frozen=True)
class Description:
    """Tensor name -> type, from ``quant_model_description.json``."""

    types: Mapping[str, str]
    model_quant_type: str | None = None
    source: str = DESCRIPTION_FILE
    #: tensor name -> (dtype, shape) from the checkpoint's safetensors headers (empty when not read)
    tensors: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], source: str = DESCRIPTION_FILE) -> "Description":
        types = {k: v for k, v in raw.items() if k not in _META_KEYS and isinstance(v, str)}
        odd = sorted(k for k, v in raw.items() if k not in _META_KEYS and not isinstance(v, str))
        if odd:
            raise QuantizationError(f"{source}: entry {odd[0]!r} is {raw[odd[0]]!r}; every tensor entry must name a "
                                    "type (a string such as \"W8A8_DYNAMIC\" or \"FLOAT\")")
        if not types:
            raise QuantizationError(f"{source} names no tensors: is it msModelSlim's quant_model_description.json?")
        return cls(types, raw.get("model_quant_type"), source)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "Description":
        path = Path(model_dir) / DESCRIPTION_FILE
        if not path.is_file():
            raise QuantizationError(
                f"--quantization ascend needs msModelSlim's {DESCRIPTION_FILE} in the model directory; {path} does "
                "not exist (quantize the model with `msmodelslim quant ... --config_path CFG.yaml`, or drop "
                "--quantization for an unquantized model)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise QuantizationError(f"{path} is not readable JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise QuantizationError(f"{path} must hold a JSON object (tensor name -> type)")
        return cls.from_json(raw, str(path))

    def weight_type(self, prefix: str) -> str | None:
        """The type of layer ``prefix``'s weight (None when the description does not list it)."""
        return self.types.get(f"{prefix}.weight")

    # -- checks ------------------------------------------------------------------

    def check_types(self) -> None:
        """Every type is one the kernel serves (W4A8_DYNAMIC only on MoE experts, where the kernel runs it)."""
        for name, kind in self.types.items():
            if kind in SERVED_TYPES or (kind in EXPERT_SCHEMES and ".experts." in name):
                continue
            if kind in EXPERT_SCHEMES:
                raise QuantizationError(
                    f"{self.source}: tensor {name!r} has type {kind}, which the kernel serves on MoE experts only "
                    f"(other layers: {', '.join(SERVED_TYPES)})")
            raise QuantizationError(
                f"{self.source}: tensor {name!r} has type {kind!r}, which the kernel does not serve. Allowed types: "
                f"{', '.join(SERVED_TYPES)} (and {', '.join(EXPERT_SCHEMES)} on MoE experts)")

    def with_tensors(self, headers: Mapping[str, tuple[str, tuple[int, ...]]]) -> "Description":
        return Description(self.types, self.model_quant_type, self.source, dict(headers))

    def check_tensors(self) -> None:
        """Every quantized weight is int8 and has the scales its scheme needs, with the right shapes."""
        if not self.tensors:
            return
        for name, kind in sorted(self.types.items()):
            if not name.endswith(".weight") or kind == FLOAT:
                continue
            prefix = name[: -len(".weight")]
            if f"{prefix}.weight_scale_second" in self.tensors:
                raise QuantizationError(
                    f"layer {prefix!r} is {kind} with per-group scales ({prefix}.weight_scale_second): the kernel "
                    "serves per-channel int4 experts, as msModelSlim's ascendv1_saver writes them")
            if name not in self.tensors:
                raise QuantizationError(f"{self.source} lists {name!r} as {kind}, but no checkpoint file holds it")
            dtype, shape = self.tensors[name]
            if dtype != "I8" or len(shape) != 2:
                raise QuantizationError(f"tensor {name!r} ({kind}) must be int8 [N, K]; the checkpoint holds {dtype} "
                                        f"{list(shape)}")
            out_features = shape[0] * ROWS_PER_BYTE.get(kind, 1)
            for rule in TENSORS.get(kind, ()):
                tensor = f"{prefix}.{rule.suffix}"
                if tensor not in self.tensors:
                    if rule.required:
                        raise QuantizationError(
                            f"layer {prefix!r} is {kind} but the checkpoint has no {tensor!r} ({kind} stores "
                            f"{', '.join(r.suffix for r in TENSORS[kind] if r.required)} beside the weight)")
                    continue
                if not rule.fits(self.tensors[tensor][1], out_features):
                    raise QuantizationError(
                        f"tensor {tensor!r} has shape {list(self.tensors[tensor][1])}; for {kind} with weight "
                        f"{list(shape)} it must be {rule.shape_text.replace('N', str(out_features))}")

    def check_fused(self, prefix: str, shard_prefixes: Iterable[str]) -> str | None:
        """The one type of a fused layer's shards (q/k/v, gate/up); mixed types are refused."""
        kinds = {p: self.weight_type(p) for p in shard_prefixes}
        listed = {p: k for p, k in kinds.items() if k is not None}
        if len(set(listed.values())) > 1:
            shown = ", ".join(f"{p.rsplit('.', 1)[-1]}={k}" for p, k in listed.items())
            raise QuantizationError(
                f"layer {prefix!r} fuses shards of different types ({shown}); vLLM runs them as one matrix, so "
                "they must share one type (quantize them alike with msModelSlim)")
        return next(iter(listed.values()), None)


def read_headers(model_dir: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype, shape) for every ``*.safetensors`` file of a model (headers only)."""
    headers: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                headers[name] = (meta["dtype"], tuple(meta["shape"]))
    return headers

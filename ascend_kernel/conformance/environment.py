"""What the kit hands factories: real selection contexts over small real vLLM configs (no engine).

A factory gets an :class:`ascend_kernel.kernel.SelectionContext` whose
``vllm_config`` is a real ``VllmConfig`` built from a tiny local model
(:func:`ascend_kernel.models.tiny.create_tiny_model`; nothing is downloaded and
no engine starts). Models are written once into a cache directory
(``$XDG_CACHE_HOME/ascend-kernel/conformance``, ``~/.cache/...`` without it, or
the ``cache_dir`` given) and configs are built once per process.

An implementation is checked under the first context its ``supports(ctx)``
accepts, trying the configs its family's contract needs, then the devices
(this host's CPU first; then an Ascend NPU of each SoC, simulated with the
reference ops provider when no NPU is present, so NPU-only implementations
whose logic is host-independent are still exercised), then the settings
(defaults, then each boolean feature toggle switched on, for implementations
that a toggle enables, then each chosen family left to ``auto`` forced to each
of its installed implementations, for those that apply only beside another
family's choice, as the fusion passes beside the seam's ``ascend`` layer ops).
When none is accepted the contracts are skipped with every reason ``supports``
gave.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ascend_kernel.device import DeviceInfo, npu_available
from ascend_kernel.kernel import GLOBAL_FAMILIES, SelectionContext
from ascend_kernel.registry import Implementation, choose
from ascend_kernel.settings import KernelSettings, load_settings

GLOBAL_FAMILY_NAMES = frozenset(f.name for f in GLOBAL_FAMILIES)
#: boolean settings that only change logging, never what an implementation serves
_NOT_TOGGLES = frozenset({"trace_plugins"})
#: the capture sizes of the kit's graph config
GRAPH_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32)
#: draft tokens per step of the kit's speculative configs
NUM_SPECULATIVE_TOKENS = 3


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "ascend-kernel" / "conformance"


def _model_config(model_dir: Path, **kwargs: Any) -> Any:
    from vllm.config import ModelConfig

    return ModelConfig(model=str(model_dir), max_model_len=128, dtype="float32", **kwargs)


def _resolve_kv_layout(cfg: Any) -> None:
    """What vLLM's engine core does before workers start: fix the KV-cache layout (the layouts read it)."""
    if cfg.cache_config.kv_cache_layout is None:
        cfg.cache_config.kv_cache_layout = "LBHNC"


def _recipes() -> dict[str, tuple[str, Callable[[Path], Any]]]:
    """Config name -> (tiny-model arch, how the ``VllmConfig`` is built from the model directory)."""
    def plain(model_kwargs: dict[str, Any] | None = None, tweak: Callable[[Any], None] | None = None):
        def build(model_dir: Path) -> Any:
            from vllm.config import VllmConfig

            cfg = VllmConfig(model_config=_model_config(model_dir, **(model_kwargs or {})))
            _resolve_kv_layout(cfg)
            if tweak is not None:
                tweak(cfg)
            return cfg

        return build

    def speculative(method: str, model_kwargs: dict[str, Any] | None = None, **spec_kwargs: Any):
        def build(model_dir: Path) -> Any:
            from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig

            model = _model_config(model_dir, **(model_kwargs or {}))
            kwargs = dict(spec_kwargs)
            if kwargs.get("model") == "self":  # the draft: the tiny model itself
                kwargs["model"] = str(model_dir)
            spec = SpeculativeConfig(method=method, num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
                                     target_model_config=model, target_parallel_config=ParallelConfig(), **kwargs)
            cfg = VllmConfig(model_config=model, speculative_config=spec)
            _resolve_kv_layout(cfg)
            return cfg

        return build

    def no_chunked(cfg: Any) -> None:
        cfg.scheduler_config.enable_chunked_prefill = False

    def int8(cfg: Any) -> None:
        cfg.cache_config.cache_dtype = "int8_per_token_head"

    def graphs(cfg: Any) -> None:
        cfg.compilation_config.cudagraph_capture_sizes = list(GRAPH_CAPTURE_SIZES)

    def lbnhc(cfg: Any) -> None:
        cfg.cache_config.kv_cache_layout = "LBNHC"

    def quantized(fmt: str):
        def tweak(cfg: Any) -> None:  # the format vLLM resolved; the family's supports() reads it
            cfg.model_config.quantization = fmt
        return tweak

    def pd(cfg: Any) -> None:
        from vllm.config import KVTransferConfig

        cfg.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both")

    return {
        "llama": ("llama", plain()),
        "llama-no-chunked-prefill": ("llama", plain(tweak=no_chunked)),
        "llama-ngram": ("llama", speculative("ngram", prompt_lookup_max=3, prompt_lookup_min=1)),
        "llama-draft-model": ("llama", speculative("draft_model", model="self")),
        "llama-eagle": ("llama", speculative("eagle", model="self")),
        "qwen3_next-mtp": ("qwen3_next", speculative("mtp", {"hf_overrides": {"num_nextn_predict_layers": 1}})),
        "llama-int8-kv": ("llama", plain(tweak=int8)),
        "llama-graphs": ("llama", plain(tweak=graphs)),
        "llama-LBNHC": ("llama", plain(tweak=lbnhc)),
        "llama-pd": ("llama", plain(tweak=pd)),
        "llama-ascend-quant": ("llama", plain(tweak=quantized("ascend"))),
        "llama-compressed-tensors": ("llama", plain(tweak=quantized("compressed-tensors"))),
        "deepseek_v2": ("deepseek_v2", plain()),
        "deepseek_v2-sparse": ("deepseek_v2", plain({"hf_overrides": {"index_topk": 8, "index_head_dim": 96}})),
        # DeepSeek scales its routed experts (the recipe keeps 1.0, where vLLM multiplies by nothing)
        "deepseek_v2-scaled": ("deepseek_v2", plain({"hf_overrides": {"routed_scaling_factor": 2.0}})),
        "qwen2_moe": ("qwen2_moe", plain()),
    }


CONFIG_NAMES: tuple[str, ...] = tuple(_recipes())


@dataclass(frozen=True, slots=True)
class Found:
    """A context an implementation accepted, and how to name it in results."""

    ctx: SelectionContext
    label: str


class KitEnvironment:
    """Configs, devices and settings the kit tries; one per run (configs are cached per process)."""

    def __init__(self, settings: KernelSettings | None = None, cache_dir: str | Path | None = None) -> None:
        self.settings = settings if settings is not None else load_settings()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        #: every installed implementation, by family (the runner fills it; tables are built from it)
        self.entries: dict[str, list[Implementation]] = {}
        self._tables: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._chosen: dict[tuple[Any, ...], dict[str, Any]] = {}

    # -- models and configs ---------------------------------------------------

    def model_dir(self, arch: str) -> Path:
        return _model_dir(str(self.cache_dir), arch)

    def config(self, name: str) -> Any:
        """The cached ``VllmConfig`` called ``name`` (see :data:`CONFIG_NAMES`); do not modify it."""
        return _config(str(self.cache_dir), name)

    # -- contexts ---------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo("cpu", None), *(DeviceInfo("npu", soc) for soc in ("A2", "A3", "310P"))]

    def settings_for(self, device: DeviceInfo) -> KernelSettings:
        if device.kind == "npu" and self.settings.ops_provider == "auto" and not npu_available():
            return self.settings.model_copy(update={"ops_provider": "reference"})
        return self.settings

    def settings_variants(self, base: KernelSettings) -> list[tuple[str, KernelSettings]]:
        """The settings as given, then each off switch turned on, then each ``auto`` family forced to each of its
        installed implementations (``ASCEND_KERNEL_LAYER_OPS=ascend``): an implementation that applies only where
        a user asks for a feature, or for another family's choice, still finds a context to be checked in."""
        variants = [("", base)]
        for name, info in type(base).model_fields.items():  # the core's and every plugin's settings
            if info.annotation is bool and name not in _NOT_TOGGLES and not getattr(base, name):
                variants.append((f"{KernelSettings.env_name(name)}=1", base.model_copy(update={name: True})))
        for fam in GLOBAL_FAMILIES:  # by each family's own setting (the graph family's is graph_mode)
            if base.forced(fam.setting) is None:
                variants += [(f"{KernelSettings.env_name(fam.setting)}={entry.name}",
                              base.model_copy(update={fam.setting: entry.name}))
                             for entry in self.entries.get(fam.name, [])]
        return variants

    def find_context(self, entry: Implementation, config_names: Sequence[str], *,
                     subject: Any = None) -> tuple[Found | None, list[str]]:
        """The first context ``entry.supports`` accepts, or None and every reason it gave.

        The context is the one the kernel would hand the entry: a global
        family's gets the built ``moe_comm_method`` table and the objects
        chosen for the families resolved before it (``ctx.chosen``, chosen
        among every installed implementation as the kernel chooses); a table
        family's and a KV layout's get neither. An exception raised by
        ``supports`` propagates (the caller reports it).
        """
        reasons: list[str] = []
        for config_name in config_names:
            try:
                self.config(config_name)
            except Exception as exc:  # noqa: BLE001 - a config this vLLM cannot build: try the next one
                reasons.append(f"config {config_name} cannot be built here: {type(exc).__name__}: {exc}")
                continue
            refused: dict[str, list[str]] = {}  # reason -> devices that gave it (default settings)
            for device in self.devices():
                base = self.settings_for(device)
                device_name = device.kind + (f" {device.soc}" if device.soc else "")
                for toggle, settings in self.settings_variants(base):
                    ctx = self._context(entry.family, config_name, device, settings, toggle, subject)
                    reason = entry.supports(ctx)
                    if reason is None:
                        where = f"config {config_name}, device {device_name}" + (f", {toggle}" if toggle else "")
                        if device.kind == "npu" and not npu_available():
                            where += " (simulated, reference ops)"
                        return Found(ctx, where), reasons
                    if not toggle:
                        refused.setdefault(str(reason), []).append(device_name)
            reasons += [f"config {config_name}, device {'/'.join(devices)}: {reason}"
                        for reason, devices in refused.items()]
        return None, reasons

    def _context(self, family: str, config_name: str, device: DeviceInfo, settings: KernelSettings, toggle: str,
                 subject: Any) -> SelectionContext:
        cfg = self.config(config_name)
        if family not in GLOBAL_FAMILY_NAMES:
            return SelectionContext(cfg, settings, device, subject)
        tables = self.tables(config_name, device)
        chosen = self._chosen_before(family, config_name, device, settings, toggle, tables)
        return SelectionContext(cfg, settings, device, subject, tables, chosen)

    def _chosen_before(self, family: str, config_name: str, device: DeviceInfo, settings: KernelSettings,
                       toggle: str, tables: Mapping[str, Any]) -> Mapping[str, Any]:
        """What the kernel would have chosen, under this context, for the global families resolved before ``family``."""
        key = (config_name, device.kind, device.soc, toggle)
        if key not in self._chosen:
            chosen: dict[str, Any] = {}
            cfg = self.config(config_name)
            for fam in GLOBAL_FAMILIES:
                ctx = SelectionContext(cfg, settings, device, None, tables, dict(chosen))
                try:
                    impl, _ = choose(fam.name, self.entries.get(fam.name, []), ctx, forced=settings.forced(fam.setting),
                                     forcing_setting=settings.source_name(fam.setting), optional=fam.optional)
                    chosen[fam.name] = impl.build(ctx) if impl is not None else None
                except Exception:  # noqa: BLE001 - that method's own checks report it
                    break
            self._chosen[key] = chosen
        order = [f.name for f in GLOBAL_FAMILIES]
        before = set(order[:order.index(family)])
        return {name: obj for name, obj in self._chosen[key].items() if name in before}

    def tables(self, config_name: str, device: DeviceInfo) -> Mapping[str, Mapping[str, Any]]:
        """The built ``moe_comm_method`` table for a context, as the kernel builds it (every supported entry)."""
        key = (config_name, f"{device.kind}:{device.soc}")
        if key not in self._tables:
            ctx = SelectionContext(self.config(config_name), self.settings_for(device), device)
            built: dict[str, Any] = {}
            for entry in self.entries.get("moe_comm_method", []):
                try:
                    if entry.supports(ctx) is None:
                        obj = entry.build(ctx)
                        for key_name in (entry.name, *entry.aliases):
                            built[key_name] = obj
                except Exception:  # noqa: BLE001 - later families then see what could be chosen before
                    continue
            self._tables[key] = {"moe_comm_method": built}
        return self._tables[key]


@functools.cache
def _model_dir(cache_dir: str, arch: str) -> Path:
    from ascend_kernel.models import create_tiny_model, tiny_model_cache_dir

    return create_tiny_model(arch, tiny_model_cache_dir(arch, base=cache_dir))


@functools.cache
def _config(cache_dir: str, name: str) -> Any:
    arch, build = _recipes()[name]
    return build(_model_dir(cache_dir, arch))

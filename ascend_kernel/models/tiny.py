"""Small random-weight Hugging Face models, built locally, for offline tests and demos.

The end-to-end tests compare vLLM against transformers token by token, and the
hosts that run them have no network. So every model here is written from
nothing: the shared byte-level BPE tokenizer (:mod:`.tokenizer`), a config
small enough to build in a second (one module per family: :mod:`.llama`,
:mod:`.deepseek`, :mod:`.qwen`, :mod:`.mamba`, :mod:`.gemma`, :mod:`.bert`),
and weights drawn from a seeded generator so that the same ``arch``, ``seed``
and ``overrides`` always give the same bytes.

Typical use::

    from ascend_kernel.models import create_tiny_model, tiny_model_cache_dir
    path = create_tiny_model("llama", tiny_model_cache_dir("llama"))
    wide = create_tiny_model("qwen2_moe", "/tmp/wide-moe", overrides={"hidden_size": 512, "num_experts": 16})
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ascend_kernel.models import bert, deepseek, gemma, llama, mamba, qwen, qwen_vl
from ascend_kernel.models.builders import Recipe, add_weights, init_weights
from ascend_kernel.models.dirs import build_marked, read_marker
from ascend_kernel.models.tokenizer import SPECIAL_TOKENS, build_tokenizer

RECIPES: dict[str, Recipe] = {
    **llama.RECIPES, **deepseek.RECIPES, **qwen.RECIPES, **mamba.RECIPES, **gemma.RECIPES, **bert.RECIPES,
    **qwen_vl.RECIPES,
}

#: Architectures :func:`create_tiny_model` can build.
SUPPORTED_ARCHS: tuple[str, ...] = tuple(RECIPES)

#: Weight dtypes accepted for ``dtype`` (float32 is the one the tests compare in).
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

#: architectures saved as bare encoders (embedding models) rather than causal LMs
ENCODER_ARCHS = frozenset(arch for arch, recipe in RECIPES.items() if recipe.encoder)

#: image-text models (their processors' configs written beside the tokenizer)
VISION_ARCHS = frozenset(arch for arch, recipe in RECIPES.items() if recipe.vision is not None)

#: draft heads: saved like their base model, then rewritten into the head's checkpoint layout
DRAFT_HEAD_ARCHS = frozenset(arch for arch, recipe in RECIPES.items() if recipe.rewrite is not None)

#: Default parent of cached models (relative: resolved against the working directory).
DEFAULT_CACHE_BASE = Path(".cache/tiny-models")

#: Name of the marker that says a directory holds a finished tiny model, and which one.
MARKER_NAME = "tiny_model.json"

#: Bumped whenever the recipe changes, so stale cached models are rebuilt.
RECIPE_VERSION = 1


def tiny_model_cache_dir(arch: str, seed: int = 0, base: str | Path = DEFAULT_CACHE_BASE) -> Path:
    """Default directory for one cached model: ``<base>/<arch>-seed<seed>``.

    One directory per (arch, seed) so several models can be cached side by side
    and :func:`create_tiny_model` can reuse them across runs.
    """
    return Path(base) / f"{arch}-seed{seed}"


def create_tiny_model(arch: str, out_dir: str | Path, *, seed: int = 0, dtype: str = "float32",
                      overrides: Mapping[str, Any] | None = None) -> Path:
    """Write (or reuse) a random-weight model for ``arch`` at ``out_dir`` and return its path.

    ``overrides`` sets config fields before the weights are drawn (a wider
    model for a benchmark: ``{"hidden_size": 512, "num_experts": 16}``); each
    must be a field the arch's config has. The directory holds
    ``config.json``, ``model.safetensors``, the tokenizer files,
    ``generation_config.json`` and a :data:`MARKER_NAME` marker, and loads
    offline in both transformers and vLLM. A directory whose marker already
    names this arch, seed, dtype, overrides and recipe is returned untouched; a
    tiny model built with other settings is replaced; any other non-empty
    directory is refused (it is not ours to overwrite). The model is built in a
    temporary sibling and renamed into place, so readers never see a half
    written model.
    """
    if arch not in RECIPES:
        raise ValueError(f"unknown tiny-model arch {arch!r}; allowed: {', '.join(SUPPORTED_ARCHS)}")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported tiny-model dtype {dtype!r}; allowed: {', '.join(SUPPORTED_DTYPES)}")
    fields = dict(overrides or {})
    _check_overrides(arch, fields)
    out = Path(out_dir)
    wanted: dict[str, Any] = {"arch": arch, "seed": int(seed), "dtype": dtype, "recipe": RECIPE_VERSION}
    if fields:
        wanted["overrides"] = fields
    if read_marker(out, MARKER_NAME) == wanted:
        return out
    if out.exists() and read_marker(out, MARKER_NAME) is None and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not a tiny model; refusing to overwrite it")

    return build_marked(out, wanted, MARKER_NAME, lambda tmp: _build(arch, tmp, int(seed), dtype, fields))


def _check_overrides(arch: str, fields: dict[str, Any]) -> None:
    """Refuse an override that names no field of the arch's config (a typo would silently build another model)."""
    if not fields:
        return
    config = RECIPES[arch].config(1)
    unknown = sorted(name for name in fields if not hasattr(config, name))
    if unknown:
        raise ValueError(f"tiny-model arch {arch!r} has no config field {', '.join(map(repr, unknown))} to override")


def _fit_per_layer_lists(config: Any, overrides: dict[str, Any]) -> None:
    """A new layer count also sizes the per-layer ``layer_types`` list (repeating its pattern), unless overridden."""
    layer_types = getattr(config, "layer_types", None)
    if "num_hidden_layers" in overrides and "layer_types" not in overrides and isinstance(layer_types, list):
        config.layer_types = [layer_types[i % len(layer_types)] for i in range(config.num_hidden_layers)]


def _build(arch: str, out: Path, seed: int, dtype: str, overrides: dict[str, Any]) -> None:
    """Write tokenizer, config, weights and generation config for ``arch`` into ``out``."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

    recipe = RECIPES[arch]
    tokenizer = build_tokenizer()
    if recipe.vision is not None:
        recipe.vision.prepare_tokenizer(tokenizer)
    tokenizer.save_pretrained(out)
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in SPECIAL_TOKENS.items()}

    config = recipe.config(len(tokenizer))
    for name, value in overrides.items():
        setattr(config, name, value)
    _fit_per_layer_lists(config, overrides)
    for part in (config, getattr(config, "text_config", None)):  # an image-text model's decoder too
        if part is not None:
            part.bos_token_id, part.eos_token_id, part.pad_token_id = (
                ids["bos_token"], ids["eos_token"], ids["pad_token"])

    torch.manual_seed(seed)
    auto = AutoModel if recipe.encoder else AutoModelForImageTextToText if recipe.vision else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    init_weights(model, seed)
    torch_dtype = getattr(torch, dtype)
    model.to(torch_dtype)
    model.config.dtype = torch_dtype
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos_token"], eos_token_id=ids["eos_token"], pad_token_id=ids["pad_token"]
    )
    model.save_pretrained(out, safe_serialization=True)
    if recipe.vision is not None:
        recipe.vision.save_processor(out, tokenizer)
    if recipe.extra_weights is not None:
        add_weights(out / "model.safetensors", recipe.extra_weights(config, seed), torch_dtype)
    if recipe.rewrite is not None:
        recipe.rewrite(out / "model.safetensors", config, seed, torch_dtype)

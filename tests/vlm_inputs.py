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


def write_frames(folder: Path, seed: int, count: int, width: int = 64, height: int = 64) -> Path:
    """A video as a folder of ``count`` PNG frames named in order (``frame_00.png``...), each a :func:`make_image`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        make_image(seed + i, width, height).save(folder / f"frame_{i:02d}.png", format="PNG")
    return folder


def write_animation(path: Path, seed: int, count: int, width: int = 64, height: int = 64,
                    frame_ms: int = 500) -> Path:
    """An animated image of ``count`` :func:`make_image` frames, ``frame_ms`` each (GIF or WebP by suffix)."""
    frames = [make_image(seed + i, width, height) for i in range(count)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=frame_ms, loop=0,
                   **({"lossless": True} if path.suffix == ".webp" else {}))
    return path


def read_frames(path: Path) -> Any:
    """The oracle's own decode of a video: a frame folder's files in name order, or every frame of an animated
    image, with PIL, as a ``[T, H, W, 3]`` uint8 array."""
    import numpy as np
    from PIL import Image, ImageSequence

    if path.is_dir():
        return np.stack([np.asarray(Image.open(f).convert("RGB")) for f in sorted(path.iterdir())])
    with Image.open(path) as image:
        return np.stack([np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)])


def shared_tiny_vlm(tmp_path_factory: Any, arch: str) -> Path:
    """The session's tiny vision-language model of ``arch``: built once, reused by every module that asks."""
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model(arch, tmp_path_factory.getbasetemp() / "shared-vlm" / arch)


def chat_parts(count: int, message: str, videos: int = 0) -> list[dict[str, Any]]:
    """A user turn's content for transformers' chat template: ``count`` image parts, ``videos`` video parts, then
    the message (the order ``generate`` sends them in)."""
    return ([{"type": "image"} for _ in range(count)] + [{"type": "video"} for _ in range(videos)]
            + [{"type": "text", "text": message}])


def transformers_greedy(model: Path, requests: list[tuple[Any, ...]],
                        max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """The oracle: (prompt ids, greedy tokens) of transformers' processor and model for each ``(images, message)``
    or ``(images, message, videos)`` (images as paths or PIL images; videos as ``(frames [T, H, W, 3], fps)``,
    every frame sent: no sampling), one user turn through the chat template, no end-of-sequence stop."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.video_utils import VideoMetadata

    processor = AutoProcessor.from_pretrained(model)
    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    for images, message, *rest in requests:
        videos = rest[0] if rest else []
        text = processor.apply_chat_template(
            [{"role": "user", "content": chat_parts(len(images), message, len(videos))}],
            add_generation_prompt=True, tokenize=False)
        pixels = [Image.open(i).convert("RGB") if isinstance(i, (str, Path)) else i.convert("RGB") for i in images]
        clips = {"videos": [frames for frames, _ in videos], "do_sample_frames": False, "video_metadata": [
            VideoMetadata(total_num_frames=len(frames), fps=fps, duration=len(frames) / fps,
                          frames_indices=list(range(len(frames))), width=frames.shape[2], height=frames.shape[1])
            for frames, fps in videos]} if videos else {}
        batch = processor(text=[text], images=pixels or None, return_tensors="pt", **clips)
        with torch.no_grad():
            ids = hf.generate(**batch, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None)
        prompt = batch["input_ids"][0].tolist()
        out.append((prompt, ids[0, len(prompt):].tolist()))
    return out


def write_video(path: Path, seed: int, count: int, width: int = 64, height: int = 64, fps: float = 2.0) -> Any:
    """A real video file of ``count`` :func:`make_image` frames at ``fps``, written with OpenCV (vLLM's own video
    decoder, installed with vLLM) as FFV1 in AVI: a lossless codec, so the file decodes back to exactly these
    pixels and the oracle can take the frames as made. Returns them, ``[T, H, W, 3]`` uint8 RGB."""
    import cv2
    import numpy as np

    frames = np.stack([np.asarray(make_image(seed + i, width, height)) for i in range(count)])
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"FFV1"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write an FFV1 video to {path} (built without FFmpeg?)")
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    return frames

"""``generate --video PATH``: a video for a vision-language model, as a folder of frames or an animated image.

``--video`` is repeatable and attaches to the next ``--chat`` (or ``--prompt``) as ``--image`` does
(:mod:`.images`, whose flag-order rules it shares); a message's images come before its videos. A video is

* a folder of frame images, taken in file-name order (every file in it but hidden ones must be an image
  PIL decodes, all of one size), or
* an animated GIF or WebP (any image file PIL reads with more than one frame), taken frame by frame.

Frames are decoded with PIL (no video decoder, no torchvision). vLLM's Qwen-VL processors want a video as
``(frames, metadata)``: ``frames`` a ``[T, H, W, 3]`` uint8 array and ``metadata`` the fields of
transformers' ``VideoMetadata`` (``fps``, ``duration``, ``total_num_frames``, ``frames_indices``...) plus
``do_sample_frames``. The frames given are the frames sent (``do_sample_frames`` false: the processor
samples none away), so the prompt (Qwen3-VL writes each frame pair's timestamp into it) depends only on
the frames and their rate. The rate is ``--video-fps``; without it an animated image's own frame duration,
else :data:`DEFAULT_FPS`. Errors name the flag and the path: a missing path, an empty folder, a file in
it (or a ``--video`` file) that is not an image, frames of different sizes, a still image.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ascend_kernel.cli import images as image_args
from ascend_kernel.cli.arg_types import positive_number
from ascend_kernel.errors import UsageError

#: frames per second of a folder of frames when ``--video-fps`` is not given (Qwen's video sampling rate)
DEFAULT_FPS = 2.0


def add_video_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--video", action=image_args.MediaAction, metavar="PATH", default=None,
                        help="a video for the next --chat (or --prompt) message: a folder of frame images (name "
                             "order) or an animated GIF/WebP (repeatable, as --image); needs a vision-language "
                             "model")
    parser.add_argument("--video-fps", type=positive_number, default=None, metavar="FPS",
                        help=f"the frame rate of every --video (default: an animated image's own frame duration, "
                             f"else {DEFAULT_FPS:g}); Qwen3-VL writes frame timestamps from it into the prompt")


def per_prompt(args: argparse.Namespace) -> list[list[tuple[Any, dict[str, Any]]]] | None:
    """Each prompt's videos, loaded (``(frames, metadata)``), in ``generate``'s prompt order; None without
    ``--video``. Every path is checked and decoded before an engine starts."""
    paths = image_args.per_prompt(args, "--video")
    if paths is None:
        if getattr(args, "video_fps", None) is not None:
            raise UsageError("--video-fps without --video: give the video it is the frame rate of")
        return None
    loaded = {path: load_video(path, args.video_fps) for group in paths for path in dict.fromkeys(group)}
    return [[loaded[path] for path in group] for group in paths]


def load_video(path: str, fps: float | None = None) -> tuple[Any, dict[str, Any]]:
    """The video at ``path`` as vLLM takes it: ``(frames [T, H, W, 3] uint8, metadata)``."""
    import numpy as np

    source = Path(path)
    if source.is_dir():
        frames, own_fps = _folder_frames(path, source), None
    elif source.is_file():
        frames, own_fps = _animation_frames(path)
    else:
        raise UsageError(f"--video {path}: no such file or folder (give a folder of frame images or an animated "
                         "GIF/WebP)")
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        raise UsageError(f"--video {path}: its frames differ in size ({', '.join(f'{w}x{h}' for w, h in sizes)}); "
                         "every frame of a video must have the same width and height")
    rate = float(fps or own_fps or DEFAULT_FPS)
    width, height = sizes[0]
    metadata = {"fps": rate, "duration": len(frames) / rate, "total_num_frames": len(frames),
                "frames_indices": list(range(len(frames))), "width": width, "height": height,
                "video_backend": "pil", "do_sample_frames": False}
    return np.stack([np.asarray(frame) for frame in frames]), metadata


def _folder_frames(path: str, folder: Path) -> list[Any]:
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if not files:
        raise UsageError(f"--video {path}: the folder is empty; a video folder holds its frames as image files "
                         "(taken in name order)")
    frames = []
    for file in files:
        if not file.is_file():
            raise UsageError(f"--video {path}: {file.name} is not a file; a video folder holds only its frames as "
                             "image files")
        frames.append(_decode(file, f"--video {path}: {file.name}")[0])
    return frames


def _animation_frames(path: str) -> tuple[list[Any], float | None]:
    from PIL import ImageSequence

    frames, durations = _decode(Path(path), f"--video {path}", every_frame=ImageSequence.Iterator)
    if len(frames) < 2:
        raise UsageError(f"--video {path}: a still image (one frame); give it with --image, or give an animated "
                         "GIF/WebP or a folder of frames as --video")
    known = [d for d in durations if d]
    return frames, (1000.0 * len(known) / sum(known)) if known else None


def _decode(file: Path, name: str, every_frame: Any = None) -> Any:
    """One image (``every_frame`` None: ``(image, [])``) or all its frames and their durations in ms, as RGB."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            if every_frame is None:
                return image.convert("RGB"), []
            pairs = [(frame.convert("RGB"), frame.info.get("duration")) for frame in every_frame(image)]
            return [f for f, _ in pairs], [d for _, d in pairs]
    except FileNotFoundError:
        raise UsageError(f"{name}: no such file") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise UsageError(f"{name}: not an image PIL can decode ({exc})") from None

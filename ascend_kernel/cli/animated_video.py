"""``video_url`` parts that are animated WebP images: what vLLM's video decoder cannot read, handed to it in a
form it can.

vLLM decodes a video with OpenCV (installed with vLLM; its FFmpeg reads AVI, MP4, MKV, WebM and animated
GIF frame for frame). FFmpeg's WebP demuxer reads a WebP's first frame only and reports a nonsense frame
count (measured on OpenCV 5.1 / libavcodec 63 here: ``CAP_PROP_FRAME_COUNT`` about -1.8e16): vLLM's
Qwen-VL frame sampling then fails with a torch ``arange`` error (HTTP 500), and vLLM's plain ``opencv``
loader returns the first frame alone as a "video" of nonsense length. ``generate --video`` already takes
animated WebP (:mod:`.videos`, with PIL); a served request should too.

:class:`AnimationAwareVideoIO` wraps vLLM's ``VideoMediaIO`` of one request. Bytes that are not a WebP go
to vLLM's loader untouched (a user with OpenCV takes vLLM's own path, sampling and metadata). An animated
WebP is decoded with PIL (every frame composited to the canvas, as PIL and browsers show it), written
losslessly (FFV1 in AVI, at the frame rate its frame durations give) and that video handed to the same
vLLM loader: vLLM's sampling, metadata and processor see a video exactly like the WebP, pixel for pixel.
A still WebP sent as a video is HTTP 400 naming it (send it as ``image_url``). The kernel's media
connector (:mod:`.media`) applies the wrapper to every video it loads.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm.multimodal.media import MediaIO, VideoMediaIO


def is_webp(data: bytes) -> bool:
    """The RIFF container with the WebP form type (the first 12 bytes of every WebP file)."""
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def webp_frames(data: bytes) -> tuple[Any, float]:
    """An animated WebP's frames (``[T, H, W, 3]`` uint8 RGB) and its frame rate (frames over the summed frame
    durations). A still or undecodable WebP is a ``ValueError`` naming what to send instead."""
    import io

    import numpy as np
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            pairs = [(np.asarray(f.convert("RGB")), f.info.get("duration") or 0)
                     for f in ImageSequence.Iterator(image)]
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"video_url: a WebP file PIL cannot decode ({exc})") from None
    if len(pairs) < 2:
        raise ValueError("video_url: a still WebP image (one frame) is no video; send it as an image_url part, "
                         "or send an animated WebP/GIF or a video file")
    total_ms = sum(d for _, d in pairs)
    if total_ms <= 0:
        raise ValueError("video_url: an animated WebP without frame durations (its frame rate is unknown); "
                         "give its frames a duration")
    return np.stack([f for f, _ in pairs]), 1000.0 * len(pairs) / total_ms


def lossless_video(frames: Any, fps: float) -> bytes:
    """``frames`` as an FFV1 AVI file's bytes at ``fps`` (lossless: OpenCV reads back these very pixels)."""
    import cv2

    count, height, width, _ = frames.shape
    handle, name = tempfile.mkstemp(suffix=".avi")
    os.close(handle)
    try:
        writer = cv2.VideoWriter(name, cv2.VideoWriter_fourcc(*"FFV1"), fps, (width, height))
        if not writer.isOpened():
            raise ValueError("video_url: this server's OpenCV cannot write FFV1 video (built without FFmpeg), "
                             "so it cannot read animated WebP; send a video file or an animated GIF")
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        return Path(name).read_bytes()
    finally:
        os.unlink(name)


class AnimationAwareVideoIO(MediaIO[Any]):
    """vLLM's ``VideoMediaIO`` for one request; an animated WebP goes to it as a lossless video of its frames."""

    def __init__(self, inner: VideoMediaIO) -> None:
        super().__init__()
        self.inner = inner

    def get_max_bytes(self) -> int | None:
        return self.inner.get_max_bytes()

    def load_bytes(self, data: bytes) -> Any:
        if not is_webp(data):
            return self.inner.load_bytes(data)
        loaded = self.inner.load_bytes(lossless_video(*webp_frames(data)))
        return dataclasses.replace(loaded, original_bytes=data)  # the request's own bytes, as vLLM keeps them

    def load_base64(self, media_type: str, data: str) -> Any:
        if media_type.lower() == "video/jpeg":  # vLLM's comma-separated JPEG frames: no container to read
            return self.inner.load_base64(media_type, data)
        return self.load_bytes(base64.b64decode(data, validate=True))

    def load_file(self, filepath: Path) -> Any:
        return self.load_bytes(filepath.read_bytes())

    def __getattr__(self, name: str) -> Any:  # anything else (encode_base64, num_frames...) is vLLM's
        if name == "inner":  # not set yet (a copy being built): no delegation loop
            raise AttributeError(name)
        return getattr(self.inner, name)


def aware(media_io: Any) -> Any:
    """``media_io`` wrapped when it loads videos; any other media's loader unchanged."""
    return AnimationAwareVideoIO(media_io) if isinstance(media_io, VideoMediaIO) else media_io

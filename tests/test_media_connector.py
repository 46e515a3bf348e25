"""``serve``'s media connector (ascend_kernel/cli/media.py): vLLM's, except that an image host the server cannot
connect to is a 400 naming it. vLLM's own connector, on the same URLs, is the oracle for everything else."""

from __future__ import annotations

import base64
import io
import os

import pytest

from tests.vlm_inputs import make_image

UNREACHABLE = "http://images.example.invalid/cat.png"  # .invalid never resolves (RFC 2606)


def _io():
    from vllm.multimodal.media import ImageMediaIO

    return ImageMediaIO()


def test_an_unreachable_image_host_is_a_validation_error_naming_it() -> None:
    """vLLM's connector raises the network error (HTTP 500 in the server) after its retries (about 5 s here);
    the sync path here, the server's async path in tests/e2e/test_vision_serving.py."""
    from vllm.exceptions import VLLMValidationError

    from ascend_kernel.cli.media import KernelMediaConnector

    with pytest.raises(VLLMValidationError, match="cannot reach images.example.invalid"):
        KernelMediaConnector().load_from_url(UNREACHABLE, _io())


def test_data_urls_load_as_vllms_connector_loads_them() -> None:
    from vllm.multimodal.media import MediaConnector

    from ascend_kernel.cli.media import KernelMediaConnector

    buffer = io.BytesIO()
    make_image(3, 40, 30).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    ours, theirs = KernelMediaConnector().load_from_url(url, _io()), MediaConnector().load_from_url(url, _io())
    assert ours.size == theirs.size == (40, 30) and ours.tobytes() == theirs.tobytes()


def test_serve_selects_the_connector_for_the_block_only_and_leaves_a_users_choice(monkeypatch) -> None:
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from ascend_kernel.cli.media import NAME, VARIABLE, KernelMediaConnector, connector_selected

    monkeypatch.delenv(VARIABLE, raising=False)
    with connector_selected():
        assert os.environ[VARIABLE] == NAME
        assert MEDIA_CONNECTOR_REGISTRY.name2class[NAME] is KernelMediaConnector
    assert VARIABLE not in os.environ
    monkeypatch.setenv(VARIABLE, "http")
    with connector_selected():
        assert os.environ[VARIABLE] == "http"
    assert os.environ[VARIABLE] == "http"


def _video_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def test_an_animated_webp_video_loads_as_vllm_loads_the_same_frames_as_a_video_file(tmp_path) -> None:
    """vLLM's own connector fails on an animated WebP (its OpenCV reads one frame and a nonsense frame count);
    the kernel's gives vLLM's own loading of the same frames written as a lossless video file (the oracle)."""
    import numpy as np
    from vllm.multimodal.media import MediaConnector

    from ascend_kernel.cli.media import KernelMediaConnector
    from tests.vlm_inputs import read_frames, write_animation, write_video

    webp = write_animation(tmp_path / "clip.webp", 30, 6, 56, 42, frame_ms=250)
    frames = write_video(tmp_path / "clip.avi", 30, 6, 56, 42, fps=4.0)
    assert np.array_equal(read_frames(webp), frames)  # the same pixels in both files (lossless WebP)
    qwen = {"video_processor": "Qwen2VLVideoProcessor"}
    webp_url = _video_url(webp.read_bytes(), "video/webp")
    with pytest.raises(RuntimeError):  # stock vLLM: its Qwen2-VL sampling on the nonsense frame count
        MediaConnector().fetch_video(webp_url, **qwen)
    ours = KernelMediaConnector().fetch_video(webp_url, **qwen)
    theirs = MediaConnector().fetch_video(_video_url((tmp_path / "clip.avi").read_bytes(), "video/x-msvideo"), **qwen)
    (ours_frames, ours_meta), (their_frames, their_meta) = ours.media, theirs.media
    assert ours_frames.shape == (4, 42, 56, 3) and np.array_equal(ours_frames, their_frames)  # 6 frames at 4 fps
    assert ours_meta == their_meta and ours_meta["fps"] == 4.0, (ours_meta, their_meta)
    assert ours.original_bytes == webp.read_bytes()  # vLLM hashes the request's own bytes


def test_other_videos_are_vllms_and_a_still_webp_is_refused_by_name(tmp_path) -> None:
    import numpy as np
    from vllm.multimodal.media import MediaConnector

    from ascend_kernel.cli.media import KernelMediaConnector
    from tests.vlm_inputs import write_video

    write_video(tmp_path / "clip.avi", 40, 4, 28, 28, fps=2.0)
    url = _video_url((tmp_path / "clip.avi").read_bytes(), "video/x-msvideo")
    (ours, ours_meta), (theirs, their_meta) = (KernelMediaConnector().fetch_video(url).media,
                                               MediaConnector().fetch_video(url).media)
    assert np.array_equal(ours, theirs) and ours_meta == their_meta and ours.shape[0] == 4
    # vLLM's own frames bundle (comma-separated base64 JPEGs, no container): vLLM's, through the wrapper
    jpegs = []
    for seed in (50, 51):
        buffer = io.BytesIO()
        make_image(seed, 28, 28).save(buffer, format="JPEG")
        jpegs.append(base64.b64encode(buffer.getvalue()).decode())
    bundle = "data:video/jpeg;base64," + ",".join(jpegs)
    (ours, ours_meta), (theirs, their_meta) = (KernelMediaConnector().fetch_video(bundle).media,
                                               MediaConnector().fetch_video(bundle).media)
    assert ours.shape == (2, 28, 28, 3) and np.array_equal(ours, theirs) and ours_meta == their_meta
    buffer = io.BytesIO()
    make_image(5, 28, 28).save(buffer, format="WEBP")
    with pytest.raises(ValueError, match="still WebP image .* send it as an image_url"):
        KernelMediaConnector().fetch_video(_video_url(buffer.getvalue(), "video/webp"))

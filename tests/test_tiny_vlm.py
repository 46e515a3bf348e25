"""The tiny Qwen2.5-VL: the family's geometry, tokens and processors, loadable offline by transformers.

The engine side (vLLM's processor, the kernel's greedy tokens against transformers') is
tests/e2e/test_vision_language.py; these stay engine-free.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_kernel.models.qwen_vl import VISION_TOKENS
from ascend_kernel.models.tiny import create_tiny_model
from tests.vlm_inputs import make_image

QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model("qwen2_5_vl", tmp_path_factory.mktemp("vlm") / "qwen2_5_vl")


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
    vision = config.vision_config
    assert (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size) == (14, 2, 2)
    assert vision.window_size == 112 and 0 < len(vision.fullatt_block_indexes) < vision.depth
    tok = processor.tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in VISION_TOKENS] == list(range(len(tok) - len(VISION_TOKENS), len(tok)))
    assert tok.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tok.convert_tokens_to_ids("<|video_pad|>") == config.video_token_id
    assert tok.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert tok.convert_tokens_to_ids("<|vision_end|>") == config.vision_end_token_id
    assert config.text_config.vocab_size == len(tok)
    # torchvision is installed (setup): transformers picks its torchvision processors, as for any real user
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert type(processor.video_processor).__name__ == "Qwen2VLVideoProcessor"


def test_placeholder_run_is_one_token_per_merged_patch_and_spans_several_windows(processor) -> None:  # noqa: ANN001
    text = _chat(processor, [{"type": "image"}, {"type": "text", "text": QUESTION}])
    assert "<|vision_start|><|image_pad|><|vision_end|>" + QUESTION in text
    batch = processor(text=[text], images=[make_image(0)], return_tensors="pt")
    t, h, w = batch["image_grid_thw"][0].tolist()
    assert (t, h, w) == (1, 12, 16)  # 168 x 224 pixels in 14-pixel patches, one temporal patch (2 frames)
    assert batch["pixel_values"].shape == (t * h * w, 3 * 2 * 14 * 14)
    ids = batch["input_ids"][0].tolist()
    assert ids.count(processor.image_token_id) == t * h * w // 4
    assert h * 14 > 112 and w * 14 > 112  # wider than one attention window each way: window attention matters


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

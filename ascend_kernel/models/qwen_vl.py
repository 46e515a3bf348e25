"""Qwen2.5-VL and Qwen3-VL: tiny vision-language models with the real families' geometry, tokens and processors.

Widths and depths are small, but everything that decides *where* image tokens
go and how pixels become patches is the real family's: patch 14, temporal
patch 2, spatial merge 2 (four patches per placeholder token), window
attention in 112-pixel windows with the last vision block on full attention,
mrope over (time, height, width) sections, and the special tokens
``<|vision_start|>``/``<|image_pad|>``/``<|video_pad|>``/``<|vision_end|>`` with
a ChatML template that puts them where Qwen's does. The directory carries the
image and video processors' configs, so transformers' ``AutoProcessor`` and
vLLM's multimodal processor load it offline. Qwen3-VL's differences are its own: patch 16, learned
position embeddings interpolated over the patch grid, deepstack (vision features of chosen blocks added
to the first decoder layers) and interleaved mrope sections, image mean/std 0.5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ascend_kernel.models.builders import DECODER, Recipe, Vision

#: Added after the BPE vocabulary, in this order: their ids are the last ``len(VISION_TOKENS)`` ids.
VISION_TOKENS: tuple[str, ...] = (
    "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>",
)

#: Smallest and largest image the processors resize to (pixels); small, so a test image is a few dozen tokens.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 128

#: ChatML with Qwen's vision placeholders; string content or a list of ``image``/``video``/``text`` parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def token_id(vocab_size: int, token: str) -> int:
    """The id of one of :data:`VISION_TOKENS` in a vocabulary of ``vocab_size`` that ends with them."""
    return vocab_size - len(VISION_TOKENS) + VISION_TOKENS.index(token)


def qwen2_5_vl_config(vocab_size: int) -> Any:
    """Qwen2.5-VL: a two-block vision tower (block 0 windowed, block 1 full) over the two-layer GQA decoder.

    Text head_dim is 64, so the mrope sections (time, height, width) are
    [8, 12, 12] rotary pairs: the real model's 16/24/24 split of 64 pairs, halved.
    """
    from transformers import Qwen2_5_VLConfig

    text = {**DECODER, "vocab_size": vocab_size, "bos_token_id": None, "eos_token_id": None, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}}
    vision = {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "in_channels": 3,
              "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
              "fullatt_block_indexes": [1], "out_hidden_size": DECODER["hidden_size"], "tokens_per_second": 2,
              "initializer_range": DECODER["initializer_range"]}
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=token_id(vocab_size, "<|image_pad|>"), video_token_id=token_id(vocab_size, "<|video_pad|>"),
        vision_start_token_id=token_id(vocab_size, "<|vision_start|>"),
        vision_end_token_id=token_id(vocab_size, "<|vision_end|>"),
    )


def qwen3_vl_config(vocab_size: int) -> Any:
    """Qwen3-VL: a three-block vision tower whose blocks 0 and 1 feed deepstack, over a q/k-normed decoder.

    Interleaved mrope sections [12, 10, 10] of 32 pairs (the real model's 24/20/20 of 64, halved).
    """
    from transformers import Qwen3VLConfig

    text = {**DECODER, "vocab_size": vocab_size, "head_dim": 64, "rope_parameters": {
        "rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [12, 10, 10], "mrope_interleaved": True}}
    vision = {"depth": 3, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "in_channels": 3,
              "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 256,
              "deepstack_visual_indexes": [0, 1], "out_hidden_size": DECODER["hidden_size"],
              "hidden_act": "gelu_pytorch_tanh", "initializer_range": DECODER["initializer_range"]}
    return Qwen3VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=token_id(vocab_size, "<|image_pad|>"), video_token_id=token_id(vocab_size, "<|video_pad|>"),
        vision_start_token_id=token_id(vocab_size, "<|vision_start|>"),
        vision_end_token_id=token_id(vocab_size, "<|vision_end|>"),
    )


def add_vision_tokens(tokenizer: Any) -> None:
    """Give the shared tokenizer the family's special tokens and chat template (in place).

    Like Qwen's tokenizer it adds no BOS: the chat template is the whole
    prompt, so transformers' processor and vLLM's renderer give the same ids.
    """
    from tokenizers import processors

    tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE


def save_qwen2_5_vl_processor(out: Path, tokenizer: Any) -> None:
    """Write the image processor, video processor and processor configs beside the tokenizer."""
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    geometry = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
    Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(size=size, **geometry),
                        video_processor=Qwen2VLVideoProcessor(size=size, **geometry),
                        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)


def save_qwen3_vl_processor(out: Path, tokenizer: Any) -> None:
    """Qwen3-VL's processors: 16-pixel patches (32-pixel merged tokens), mean and std 0.5."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    size = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 100}
    geometry = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3}
    Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(size=size, **geometry),
                     video_processor=Qwen3VLVideoProcessor(size=size, **geometry),
                     tokenizer=tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)


RECIPES: dict[str, Recipe] = {
    "qwen2_5_vl": Recipe(qwen2_5_vl_config, vision=Vision(add_vision_tokens, save_qwen2_5_vl_processor)),
    "qwen3_vl": Recipe(qwen3_vl_config, vision=Vision(add_vision_tokens, save_qwen3_vl_processor)),
}

"""``generate --image PATH``: images for a vision-language model, each attached to the prompt after it.

``--image`` is repeatable and attaches to the next ``--chat`` (or ``--prompt``) on the command line:
``--image a.png --chat "What is this?" --image a.png --image b.png --chat "Compare them."`` sends one
image with the first message and two with the second. A command gives its images with one kind of
prompt (``--chat`` or ``--prompt``), so the order is never ambiguous. A ``--chat`` message becomes the
user's turn of the model's chat template with one image part per image (the template places the
model's own placeholders); a ``--prompt`` gets the model's placeholders in front unless it already
holds them. Prompts with images run one request after another, in order, so a repeated image finds
the previous request's prefix cache (each output's ``num_cached_tokens`` says how many prompt tokens
it reused). Errors name the flag: an image for a text-only model, a file that is missing or not an
image, an image with no prompt after it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ascend_kernel.errors import UsageError

#: how a model directory says it takes images: the processor configs transformers and vLLM load
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class _ImageAction(argparse.Action):
    """Records each ``--image`` with how many ``--prompt``/``--chat`` were given before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seen = (len(getattr(namespace, "prompt", None) or ()), len(getattr(namespace, "chat", None) or ()))
        namespace.image = [*(getattr(namespace, "image", None) or ()), (str(values), *seen)]


def add_image_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", action=_ImageAction, metavar="PATH", default=None,
                        help="an image file for the next --chat (or --prompt) message (repeatable: several images "
                             "per message, and per command); needs a vision-language model")


def per_prompt(args: argparse.Namespace) -> list[list[str]] | None:
    """The image paths of each prompt, in ``generate``'s prompt order (``--prompt``s, then ``--chat``s); None
    without ``--image``. Checks the order of the flags and that the model takes images."""
    given = getattr(args, "image", None)
    if not given:
        return None
    prompts, chats = list(args.prompt or ()), list(args.chat or ())
    if getattr(args, "lora", None):
        raise UsageError("--image with --lora: adapters with images are not supported by generate; drop one")
    if prompts and chats or args.prompt_ids:
        raise UsageError("--image attaches to the --chat (or --prompt) after it: give the images of one command "
                         "with one kind of prompt (--chat or --prompt, not both, and no --prompt-ids)")
    kind, count = ("--chat", len(chats)) if chats else ("--prompt", len(prompts))
    images: list[list[str]] = [[] for _ in range(count)]
    for path, before_prompt, before_chat in given:
        index = before_chat if chats else before_prompt
        if index >= count:
            raise UsageError(f"--image {path}: no {kind} follows it; put each --image before the message it "
                             "belongs to")
        images[index].append(path)
    check_model_takes_images(args.model, [p for group in images for p in group])
    return images


def check_model_takes_images(model: str, paths: list[str]) -> None:
    """Refuse images for a local text-only model before an engine starts, and files that are not images."""
    folder = Path(model)
    if folder.is_dir() and not any(_has_image_processor(folder / name) for name in _PROCESSOR_FILES):
        arch = _architectures(folder)
        raise UsageError(f"--image: the model at {model} ({arch}) takes no images (no image processor in "
                         f"{' or '.join(_PROCESSOR_FILES)}); give a vision-language model (e.g. "
                         "ascend-kernel tiny-model --arch qwen2_5_vl), or drop --image")
    for path in dict.fromkeys(paths):
        load_image(path)


def _has_image_processor(path: Path) -> bool:
    if not path.is_file():
        return False
    if path.name == "preprocessor_config.json":
        return True
    try:
        return "image_processor" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def _architectures(folder: Path) -> str:
    try:
        return ", ".join(json.loads((folder / "config.json").read_text()).get("architectures") or ["?"])
    except (OSError, ValueError):
        return "no readable config.json"


def load_image(path: str) -> Any:
    """The image at ``path`` as an RGB PIL image; a missing or undecodable file is a UsageError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise UsageError(f"--image {path}: no such file") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise UsageError(f"--image {path}: not an image PIL can decode ({exc})") from None


def limit_request(request: Any, images: list[list[str]]) -> None:
    """Let the engine take as many images per prompt as the command gives (no video), unless the user set it."""
    most = max(len(group) for group in images)
    request.extra.setdefault("limit_mm_per_prompt", {"image": max(most, 1), "video": 0})


def prompt_inputs(llm: Any, prompts: list[tuple[Any, bool | None]], images: list[list[str]]) -> list[Any]:
    """vLLM prompts with their images (``multi_modal_data``), one per ``(text, is_chat)``."""
    from vllm.inputs import TextPrompt, TokensPrompt

    if not llm.model_config.is_multimodal_model:
        raise UsageError(f"--image: {llm.model_config.model} is not a multimodal model in vLLM "
                         f"({', '.join(llm.model_config.architectures)}); drop --image or give a vision-language model")
    inputs: list[Any] = []
    for (text, chat), paths in zip(prompts, images):
        data = {"multi_modal_data": {"image": [load_image(p) for p in paths]}} if paths else {}
        if chat:
            tokenizer = llm.get_tokenizer()
            parts = [{"type": "image"} for _ in paths] + [{"type": "text", "text": text}]
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                                     add_generation_prompt=True)
            inputs.append(TokensPrompt(prompt_token_ids=tokenizer.encode(rendered, add_special_tokens=False),
                                       **data))
        else:
            inputs.append(TextPrompt(prompt=_with_placeholders(llm, text, len(paths)), **data))
    return inputs


def _with_placeholders(llm: Any, text: str, count: int) -> str:
    if count == 0:
        return text
    from vllm.model_executor.model_loader import get_model_cls

    model_cls = get_model_cls(llm.model_config)
    marks = [model_cls.get_placeholder_str("image", i) for i in range(1, count + 1)]
    return text if marks[0] in text else "".join(marks) + text


def generate_each(llm: Any, inputs: list[Any], params: Any) -> list[Any]:
    """One request after another, so a later prompt can reuse an earlier one's prefix cache (images included)."""
    return [llm.generate([one], params, use_tqdm=False)[0] for one in inputs]

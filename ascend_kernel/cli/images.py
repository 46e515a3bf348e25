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


class MediaAction(argparse.Action):
    """Records each ``--image`` (or ``--video``) with how many ``--prompt``/``--chat`` were given before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seen = (len(getattr(namespace, "prompt", None) or ()), len(getattr(namespace, "chat", None) or ()))
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or ()), (str(values), *seen)])


def add_image_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", action=MediaAction, metavar="PATH", default=None,
                        help="an image file for the next --chat (or --prompt) message (repeatable: several images "
                             "per message, and per command); needs a vision-language model")


def per_prompt(args: argparse.Namespace, flag: str = "--image") -> list[list[str]] | None:
    """The paths given with ``flag`` (``--image`` or ``--video``) for each prompt, in ``generate``'s prompt order
    (``--prompt``s, then ``--chat``s); None without the flag. Checks the order of the flags and that the model
    takes images (a video's frames go through the same processor configs); the files themselves are the
    caller's to check."""
    given = getattr(args, flag.lstrip("-"), None)
    if not given:
        return None
    prompts, chats = list(args.prompt or ()), list(args.chat or ())
    if getattr(args, "lora", None):
        raise UsageError(f"{flag} with --lora: adapters with images or videos are not supported by generate; "
                         "drop one")
    if prompts and chats or args.prompt_ids:
        raise UsageError(f"{flag} attaches to the --chat (or --prompt) after it: give the media of one command "
                         "with one kind of prompt (--chat or --prompt, not both, and no --prompt-ids)")
    kind, count = ("--chat", len(chats)) if chats else ("--prompt", len(prompts))
    media: list[list[str]] = [[] for _ in range(count)]
    for path, before_prompt, before_chat in given:
        index = before_chat if chats else before_prompt
        if index >= count:
            raise UsageError(f"{flag} {path}: no {kind} follows it; put each {flag} before the message it "
                             "belongs to")
        media[index].append(path)
    check_model_takes_images(args.model, flag)
    if flag == "--image":
        for path in dict.fromkeys(p for group in media for p in group):
            load_image(path)
    return media


def check_model_takes_images(model: str, flag: str = "--image") -> None:
    """Refuse images (or videos) for a local text-only model before an engine starts."""
    folder = Path(model)
    if folder.is_dir() and not any(_has_image_processor(folder / name) for name in _PROCESSOR_FILES):
        arch = _architectures(folder)
        what = "images" if flag == "--image" else "videos"
        raise UsageError(f"{flag}: the model at {model} ({arch}) takes no {what} (no image processor in "
                         f"{' or '.join(_PROCESSOR_FILES)}); give a vision-language model (e.g. "
                         f"ascend-kernel tiny-model --arch qwen3_vl), or drop {flag}")


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


def limit_request(request: Any, images: list[list[str]] | None, videos: list[list[Any]] | None = None) -> None:
    """Let the engine take as many images and videos per prompt as the command gives, unless the user set it."""
    request.extra.setdefault("limit_mm_per_prompt", {"image": max(map(len, images or [[]])),
                                                     "video": max(map(len, videos or [[]]))})


def prompt_inputs(llm: Any, prompts: list[tuple[Any, bool | None]], images: list[list[str]] | None,
                  videos: list[list[Any]] | None = None) -> list[Any]:
    """vLLM prompts with their images and videos (``multi_modal_data``), one per ``(text, is_chat)``.

    ``videos`` holds each prompt's loaded videos (``(frames, metadata)``, :mod:`.videos`). A message's
    images come first, then its videos, then its text (the order of the chat parts and placeholders)."""
    from vllm.inputs import TextPrompt, TokensPrompt

    flag = "--image" if images else "--video"
    if not llm.model_config.is_multimodal_model:
        raise UsageError(f"{flag}: {llm.model_config.model} is not a multimodal model in vLLM "
                         f"({', '.join(llm.model_config.architectures)}); drop {flag} or give a vision-language "
                         "model")
    inputs: list[Any] = []
    for i, (text, chat) in enumerate(prompts):
        paths, clips = images[i] if images else [], videos[i] if videos else []
        data = {**({"image": [load_image(p) for p in paths]} if paths else {}), **({"video": clips} if clips else {})}
        extra = {"multi_modal_data": data} if data else {}
        if chat:
            tokenizer = llm.get_tokenizer()
            parts = ([{"type": "image"} for _ in paths] + [{"type": "video"} for _ in clips]
                     + [{"type": "text", "text": text}])
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                                     add_generation_prompt=True)
            inputs.append(TokensPrompt(prompt_token_ids=tokenizer.encode(rendered, add_special_tokens=False),
                                       **extra))
        else:
            inputs.append(TextPrompt(prompt=_with_placeholders(llm, text, len(paths), len(clips)), **extra))
    return inputs


def _with_placeholders(llm: Any, text: str, images: int, videos: int = 0) -> str:
    if images + videos == 0:
        return text
    from vllm.model_executor.model_loader import get_model_cls

    model_cls = get_model_cls(llm.model_config)
    marks = ([model_cls.get_placeholder_str("image", i) for i in range(1, images + 1)]
             + [model_cls.get_placeholder_str("video", i) for i in range(1, videos + 1)])
    return text if marks[0] in text else "".join(marks) + text


def generate_each(llm: Any, inputs: list[Any], params: Any) -> list[Any]:
    """One request after another, so a later prompt can reuse an earlier one's prefix cache (images included)."""
    return [llm.generate([one], params, use_tqdm=False)[0] for one in inputs]

"""``ascend-kernel generate``: offline generation through vLLM with the kernel; its flags are all here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ascend_kernel.cli import images as image_args
from ascend_kernel.cli import videos as video_args
from ascend_kernel.cli.arg_types import SEED, non_negative_number, probability, whole_number
from ascend_kernel.cli.engine_request import add_engine_args, engine_request
from ascend_kernel.cli.output import emit, engine_output_to_stderr
from ascend_kernel.cli.render import report_text
from ascend_kernel.errors import UsageError


DEFAULT_PROMPTS = ("The capital of France is", "Once upon a time, there was a")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``generate``'s flags: the engine's (:func:`~ascend_kernel.cli.engine_request.add_engine_args`), then its own."""
    add_engine_args(p)
    p.add_argument("--prompt", action="append", help="prompt (repeatable); two defaults without --prompt and --chat")
    p.add_argument("--prompt-ids", action="append", type=token_ids, metavar="ID,ID,...",
                   help="a prompt given as token ids, sent as they are (no BOS, no template; repeatable; after --chat)")
    p.add_argument("--chat", action="append", metavar="MESSAGE",
                   help="a user message, sent through the tokenizer's chat template (repeatable; after the --prompt "
                   "prompts)")
    image_args.add_image_option(p)
    video_args.add_video_options(p)
    p.add_argument("--stop-at-eos", action="store_true",
                   help="end an answer at the model's end-of-sequence token (default: always --max-tokens tokens, "
                   "as the tests' transformers oracle generates)")
    p.add_argument("--max-tokens", type=whole_number(1), default=16)
    p.add_argument("--temperature", type=non_negative_number, default=0.0,
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-k", type=whole_number(0), default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus mass in (0, 1] (1: off)")
    p.add_argument("--sampling-seed", type=SEED, default=None,
                   help="per-request sampling seed (vLLM's SamplingParams.seed), for reproducible random sampling")
    p.add_argument("--stock", action="store_true", help="run stock vLLM without the kernel (for comparison)")
    p.add_argument("--lora", action="append", metavar="NAME=PATH", type=lora_module,
                   help="a PEFT LoRA adapter (repeatable): every prompt runs without an adapter and then with each "
                   "adapter, all in one batch (turns LoRA on, one slot per adapter unless --engine-arg max_loras=N)")
    constraint = p.add_mutually_exclusive_group()  # structured outputs: one constraint for every prompt
    constraint.add_argument("--json-schema", metavar="FILE",
                            help="answers are JSON valid under the schema in FILE (vLLM structured outputs; compact "
                            "JSON: --engine-arg 'structured_outputs_config={\"disable_any_whitespace\": true}')")
    constraint.add_argument("--regex", help="answers match this regular expression (vLLM structured outputs)")
    constraint.add_argument("--choice", action="append", metavar="TEXT",
                            help="answers are one of these texts (repeatable; vLLM structured outputs)")


def cmd_generate(args: argparse.Namespace) -> int:
    from ascend_kernel.cli import engine

    device = engine.prepare_process(kernel=not args.stock)
    # plain prompts first, then the --chat messages (each through the chat template)
    prompts = [(p, False) for p in args.prompt or ()] + [(m, True) for m in args.chat or ()]
    prompts += [(ids, None) for ids in args.prompt_ids or ()]  # token ids as given: no BOS, no template
    prompts = prompts or [(p, False) for p in DEFAULT_PROMPTS]
    images = image_args.per_prompt(args)  # --image: per prompt, checked before an engine starts
    videos = video_args.per_prompt(args)  # --video: per prompt, decoded before an engine starts
    media = bool(images or videos)
    with engine_output_to_stderr():
        from vllm import SamplingParams

        request = engine_request(args, kernel=not args.stock)
        if media:
            image_args.limit_request(request, images, videos)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.sampling_seed, max_tokens=args.max_tokens, ignore_eos=not args.stop_at_eos,
                                structured_outputs=structured_outputs(args))
        adapters = lora_requests(args.lora or [])
        llm = engine.build_llm(request)
        try:
            from vllm.inputs import TokensPrompt

            inputs = [chat_prompt(llm, p) if chat else TokensPrompt(prompt_token_ids=p) if chat is None else p
                      for p, chat in prompts] if not media else image_args.prompt_inputs(llm, prompts, images, videos)
            runs = [(None, None)] + adapters  # every prompt without an adapter, then with each adapter
            batch, loras = [i for _ in runs for i in inputs], [r for _, r in runs for _ in inputs] if adapters else None
            outputs = image_args.generate_each(llm, inputs, params) if media else llm.generate(
                batch, params, lora_request=loras)
            report = engine.kernel_report(llm)
            spec_decode = engine.spec_decode_counts(llm)
        finally:
            engine.shutdown(llm)
    # num_cached_tokens: prompt tokens served from the prefix cache (0 without a hit)
    results = [{"prompt": p, "chat": chat, "prompt_token_ids": list(o.prompt_token_ids),
                "token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
                "num_cached_tokens": int(o.num_cached_tokens or 0), **({"lora": name} if adapters else {})}
               for (name, _), (p, chat), o in zip([r for r in runs for _ in prompts], prompts * len(runs), outputs)]
    text = report_text(report) + "\n\n" + "\n".join(
        f"{'chat' if r['chat'] else 'prompt'}: {r['prompt']!r}" + (f" (LoRA {r['lora']})" if r.get("lora") else "")
        + f"\n  tokens: {r['token_ids']}\n  text:   {r['text']!r}" for r in results)
    payload = {"device": device, "outputs": results, "report": report}
    if spec_decode is not None:
        payload["spec_decode"] = spec_decode
        text += "\n\nspec decode: " + ", ".join(f"{k} {v}" for k, v in spec_decode.items())
    emit(args, payload, text)
    return 0


def token_ids(text: str) -> list[int]:
    """``--prompt-ids 263,263,263``: one prompt's token ids."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated token ids (e.g. 263,263,263) expected") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one token id, none negative")
    return ids


def lora_requests(adapters: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """(name, vLLM ``LoRARequest``) per ``--lora NAME=PATH``; LoRA ids count from 1 (0 is "no adapter")."""
    from vllm.lora.request import LoRARequest

    names = [name for name, _ in adapters]
    if len(set(names)) != len(names):
        raise UsageError(f"--lora names {names}: each adapter needs a name of its own")
    return [(name, LoRARequest(name, i, path)) for i, (name, path) in enumerate(adapters, start=1)]


def lora_module(text: str) -> tuple[str, str]:
    """``NAME=PATH`` of a PEFT adapter directory (as ``serve --lora-modules`` takes them)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PATH (a name for the adapter, then its directory)")
    if not (Path(path) / "adapter_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} is not a PEFT adapter directory (no adapter_config.json)")
    return name, path


def structured_outputs(args: argparse.Namespace) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``--json-schema`` / ``--regex`` / ``--choice`` (None without one)."""
    if args.json_schema is None and args.regex is None and args.choice is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if args.json_schema is not None:
        try:
            schema = json.loads(Path(args.json_schema).read_text())
        except OSError as exc:
            raise UsageError(f"--json-schema {args.json_schema!r}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"--json-schema {args.json_schema!r} is no JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise UsageError(f"--json-schema {args.json_schema!r}: a JSON schema is an object, "
                             f"got {type(schema).__name__}")
        return StructuredOutputsParams(json=schema)
    if args.regex is not None:
        return StructuredOutputsParams(regex=args.regex)
    return StructuredOutputsParams(choice=list(args.choice))


def chat_prompt(llm: Any, message: str) -> Any:
    """``message`` as the user's turn of the model's chat template, ready for the assistant's answer."""
    from vllm.inputs import TokensPrompt

    tokenizer = llm.get_tokenizer()
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"--chat {message!r}: the model's tokenizer has no chat template; use --prompt instead")
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    # the template writes every special token itself (a BOS included, where the model has one)
    return TokensPrompt(prompt_token_ids=tokenizer.encode(text, add_special_tokens=False))

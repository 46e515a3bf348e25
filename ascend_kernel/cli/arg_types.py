"""The CLI's argument parser and value types: a bad value is one line naming the value and what is allowed."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn


#: argparse's message for an option given without its value
_MISSING_VALUE = re.compile(r"argument (?P<names>\S+): expected one argument")


class ArgumentParser(argparse.ArgumentParser):
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


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
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


SEED = whole_number(0, 2**32 - 1)  # numpy's seed range (vLLM seeds numpy with it)


_JSON_KINDS = {list: "a JSON list", str: "a JSON string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def json_object(example: str) -> Callable[[str], dict[str, Any]]:
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


def engine_pair(text: str) -> tuple[str, str]:
    from ascend_kernel.cli.engine_args import split_pair

    try:
        return split_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a finite number >= 0")
    return value


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a finite number > 0")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a number in (0, 1]")
    return value


def out_dir(text: str) -> str:
    if not text.strip() or "\0" in text:
        what = "is empty" if not text.strip() else "holds a NUL character"
        raise argparse.ArgumentTypeError(f"{text!r} {what}; give a directory path (a new or empty directory)")
    return text


def model_dir(text: str) -> str:
    hint = "give a local model directory (make one with: ascend-kernel tiny-model --arch llama --out DIR)"
    path = Path(text)
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}; {hint}")
    if not any((path / name).is_file() for name in ("config.json", "params.json")):
        raise argparse.ArgumentTypeError(f"{text!r} holds no config.json, so it is no model directory; {hint}")
    return text


def graph_mode_name(text: str) -> str:
    from ascend_kernel.settings import normalise_name

    if not text.strip():
        raise argparse.ArgumentTypeError("must be a graph mode name (eager, cpu-graph, aclgraph, ...)")
    return normalise_name(text)


def capture_sizes(text: str) -> tuple[int, ...]:
    from ascend_kernel.settings import parse_capture_sizes

    try:
        return parse_capture_sizes(text) or ()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

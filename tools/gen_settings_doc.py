#!/usr/bin/env python3
"""Write docs/settings.md from the settings models (the core's and the built-in plugins').

``python tools/gen_settings_doc.py`` rewrites the page; ``--check`` only
compares and exits 1 when the committed page differs (tests/test_settings_doc.py
runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    from ascend_kernel.cli.settings_doc import settings_markdown

    text = settings_markdown()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python tools/gen_settings_doc.py", file=sys.stderr)
            return 1
        print(f"{PAGE}: up to date")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

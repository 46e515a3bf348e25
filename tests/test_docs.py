"""The README stays short and points into docs/; every relative link in them leads to a file."""

from __future__ import annotations

import re
from pathlib import Path

from ascend_kernel.kernel import GLOBAL_FAMILIES, KV_CACHE_FAMILY, TABLE_FAMILIES

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_the_readme_is_short_and_gives_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text


def test_every_relative_link_leads_to_a_file():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_every_docs_page_is_on_the_readme_map():
    text = README.read_text()
    unlisted = [p.relative_to(REPO).as_posix() for p in sorted(DOCS.rglob("*.md"))
                if f"({p.relative_to(REPO).as_posix()})" not in text]
    assert unlisted == []


def test_every_family_has_a_page_that_names_its_hook():
    family_pages = "\n".join(p.read_text() for p in (DOCS / "families").glob("*.md"))
    for family in (*GLOBAL_FAMILIES, *TABLE_FAMILIES, KV_CACHE_FAMILY):
        assert f"`{family.hook}`" in family_pages, family.name
    assert "`ascend_kernel_configure" in family_pages

"""The documentation's links lead somewhere, from every place it is read.

The README is also the package index's page and the wheel's long description, where a relative link leads nowhere:
its links into the repository are absolute. The pages under docs/ link to each other relatively (GitHub resolves
them). Every link into the repository must name a file that exists, and a ``#fragment`` a heading of that file.
Offline: nothing is fetched; links to other sites are not checked.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 300
REPOSITORY = "memrl-mcp/memrl-mcp"
ABSOLUTE = {  # how a link from outside the repository names one of its files, on the main branch
    f"https://github.com/{REPOSITORY}/blob/main/": "file",
    f"https://github.com/{REPOSITORY}/tree/main/": "folder",
    f"https://raw.githubusercontent.com/{REPOSITORY}/main/": "file",
}
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
# A path of the code named in code, e.g. `memrl_mcp/validation.py` or `tests/harness/test_protocol.py::test_x`
# (not configs/ or docker/: the pages also name other repositories' configs and files a user creates there).
NAMED_PATH = re.compile(r"`((?:memrl_mcp|memrl_harness|tests|benchmarks)/[\w./-]*?)(?:::\w+)?`")


@dataclass(frozen=True)
class Link:
    page: Path
    target: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}: {self.target}"


def prose(page: Path) -> str:
    """The page without its code blocks, and its code spans blanked: a link written as an example is no link."""
    text = FENCE.sub("", page.read_text())
    return CODE_SPAN.sub(lambda span: "`" + "x" * (len(span.group()) - 2) + "`", text)


def links(page: Path) -> list[Link]:
    return [Link(page, target) for target in LINK.findall(prose(page))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not ``-`` or ``_``), spaces to ``-``."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", page.read_text()), re.M):
        anchor = slug(heading)
        found.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
        seen[anchor] += 1
    return found


def resolve(link: Link) -> tuple[Path, str, str] | None:
    """(the file or folder linked to, its kind, the fragment); None for a link out of the repository."""
    target, _, fragment = link.target.partition("#")
    for prefix, kind in ABSOLUTE.items():
        if target.startswith(prefix):
            return ROOT / target.removeprefix(prefix), kind, fragment
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # another site, or mailto:
        assert REPOSITORY not in target, f"{link}: link into the repository as {', '.join(ABSOLUTE)}..."
        return None
    return (link.page.parent / target if target else link.page), "file", fragment


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_into_the_repository_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for link in links(page):
        resolved = resolve(link)
        if resolved is None:
            continue
        path, kind, fragment = resolved
        path = path.resolve()
        if not path.is_relative_to(ROOT) or not (path.is_dir() if kind == "folder" else path.is_file()):
            broken.append(f"{link}: no {kind} {path}")
        elif fragment and (path.suffix != ".md" or fragment not in anchors(path)):
            broken.append(f"{link}: no heading #{fragment} in {path.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_into_the_repository_by_absolute_urls_only() -> None:
    """From the package index page or the wheel's metadata, a relative link leads nowhere."""
    relative = [str(link) for link in links(README) if not re.match(r"[a-z][a-z0-9+.-]*:", link.target)]
    assert not relative, "\n".join(relative)


def test_the_readme_is_read_in_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_repository_path_named_in_code_exists(page: Path) -> None:
    """`memrl_mcp/validation.py`, `tests/test_roots.py`, ...: a module that moved leaves no stale name behind."""
    text = FENCE.sub("", page.read_text())
    missing = sorted({path for path in NAMED_PATH.findall(text) if not (ROOT / path).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"

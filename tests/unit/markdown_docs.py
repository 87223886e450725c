"""Reading the project's Markdown pages as GitHub renders them: headings, their anchors, links, code blocks.

Shared by tests/unit/test_docs_links.py and tests/unit/test_docs_commands.py; no servers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pages() -> list[Path]:
    """README.md and every page of docs/: the pages whose links and commands are checked."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced code block: its info string (``sh``, ``console``, ...), its first line's number, its text."""

    lang: str
    line: int
    text: str


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def split(markdown: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """The lines outside fenced code blocks (with their numbers), and the blocks."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    fence: str | None = None
    lang, start = "", 0
    body: list[str] = []
    for number, line in enumerate(markdown.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence, lang, start, body = match.group(2), match.group(3).strip().lower(), number + 1, []
            else:
                prose.append((number, line))
        elif match and match.group(2).startswith(fence) and not match.group(3).strip():
            blocks.append(Block(lang, start, "\n".join(body)))
            fence = None
        else:
            body.append(line)
    return prose, blocks


def _heading_text(raw: str) -> str:
    """What GitHub renders of a heading's Markdown: no link targets, no emphasis or code markers."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text).strip()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, `_`, `-` and spaces
    kept), each space a hyphen."""
    text = _heading_text(heading).lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a page; a repeated heading's anchor gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    prose, _ = split(path.read_text(encoding="utf-8"))
    for _, line in prose:
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


@dataclass(frozen=True)
class Link:
    line: int
    target: str


_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path: Path) -> Iterator[Link]:
    """The inline links and images of a page, outside code blocks and inline code."""
    prose, _ = split(path.read_text(encoding="utf-8"))
    for number, line in prose:
        without_code = re.sub(r"(`+)(?:(?!\1).)+\1", "", line)
        for match in _LINK.finditer(without_code):
            yield Link(number, match.group(1))


SHELL_LANGS = frozenset({"sh", "bash", "shell", "console", "shell-session", ""})


def shell_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The command lines of a page's shell blocks, continuation lines joined: in a `console` block the lines
    after a `$ ` prompt, elsewhere every line that is not blank or a comment."""
    _, blocks = split(path.read_text(encoding="utf-8"))
    for block in blocks:
        if block.lang not in SHELL_LANGS:
            continue
        pending, first = "", 0
        for offset, raw in enumerate(block.text.splitlines()):
            line = raw.strip()
            if block.lang in ("console", "shell-session") and not pending:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not pending:
                first = block.line + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line, pending = pending + line, ""
            if line and not line.startswith("#"):
                yield first, line


def inline_code(path: Path) -> Iterator[tuple[int, str]]:
    """The inline code spans of a page's prose and tables."""
    prose, _ = split(path.read_text(encoding="utf-8"))
    for number, line in prose:
        for match in re.finditer(r"(`+)((?:(?!\1).)+)\1", line):
            yield number, match.group(2).strip()

"""Every relative link of README.md and docs/*.md points to a file that exists and, with a #fragment, to a
heading of it (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, -1 for a repeat)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.unit.markdown_docs import ROOT, anchor, anchors, links, pages


def _broken(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for link in links(page):
        target = link.target
        if "://" in target or target.startswith(("mailto:", "//")):
            continue
        path_part, _, fragment = target.partition("#")
        where = f"{page.relative_to(root)}:{link.line}: {target}"
        file = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not file.exists():
            problems.append(f"{where}: no file {file.relative_to(root) if file.is_relative_to(root) else file}")
            continue
        if not file.is_relative_to(root):
            problems.append(f"{where}: outside the repository")
            continue
        if fragment:
            if file.suffix != ".md" or file.is_dir():
                problems.append(f"{where}: a #fragment on a file that is not a Markdown page")
            elif unquote(fragment) not in anchors(file):
                problems.append(f"{where}: {file.relative_to(root)} has no heading with anchor #{fragment}")
    return problems


@pytest.mark.parametrize(
    "page", [*pages(), ROOT / "CHANGELOG.md", ROOT / "ARCHITECTURE.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_relative_link_resolves(page: Path) -> None:
    problems = _broken(page)
    assert problems == [], "\n".join(problems)


def test_the_docs_pages_are_linked_from_the_readme() -> None:
    linked = {(ROOT / link.target.partition("#")[0]).resolve() for link in links(ROOT / "README.md")}
    assert [p.name for p in pages()[1:] if p.resolve() not in linked] == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Security of `cos up`", "security-of-cos-up"),
        ("Guarantees, and how they are kept", "guarantees-and-how-they-are-kept"),
        ("Ground truth: the real CLIs", "ground-truth-the-real-clis"),
        ("A deleted profile's spend", "a-deleted-profiles-spend"),
        ("`cos status` and JetStream's store", "cos-status-and-jetstreams-store"),
        ("COS_EVENTS and [the stream](x.md)", "cos_events-and-the-stream"),
        ("Events — and *more*", "events--and-more"),
    ],
)
def test_anchors_follow_githubs_rules(heading: str, expected: str) -> None:
    assert anchor(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n\n## Notes\n", encoding="utf-8")
    assert anchors(page) == {"notes", "notes-1", "notes-2"}


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    """The check itself: a missing file and a missing heading are found, a good link and code are not."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "events.md").write_text((ROOT / "docs" / "events.md").read_text(encoding="utf-8"), encoding="utf-8")
    page = docs / "probe.md"
    page.write_text(
        "# Probe\n\n[ok](events.md#size-limits) [self](#probe) [gone](nowhere.md) [bad](events.md#no-such-heading)\n"
        "`[in code](nowhere.md)`\n\n```sh\n[in a block](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    problems = _broken(page, tmp_path)
    assert len(problems) == 2, problems
    assert "no file docs/nowhere.md" in problems[0]
    assert "no heading with anchor #no-such-heading" in problems[1]

"""docs/console.md shows every page's picture that `make console-docs` takes (docs/img/console-*.png), each a
1280x800 PNG, all of them small enough to keep in the repository."""

from __future__ import annotations

import re
from pathlib import Path

from PIL import Image

from tests.unit.markdown_docs import ROOT

PAGE = ROOT / "docs" / "console.md"
SCRIPT = ROOT / "scripts" / "console_docs.py"
#: What the pictures may weigh together.
BUDGET_BYTES = 1_500_000


def pictures() -> list[Path]:
    return sorted((ROOT / "docs" / "img").glob("console-*.png"))


def test_the_page_shows_each_picture_the_script_takes() -> None:
    taken = {f"console-{name}.png" for name in re.findall(r'shoot\("([a-z-]+)"', SCRIPT.read_text())}
    assert len(taken) >= 8, taken
    shown = set(re.findall(r"\]\(img/(console-[a-z-]+\.png)\)", PAGE.read_text()))
    assert shown == taken
    assert {p.name for p in pictures()} == taken


def test_the_pictures_are_small_palette_pngs_of_the_viewport() -> None:
    total = 0
    for path in pictures():
        with Image.open(path) as image:
            assert (image.format, image.size) == ("PNG", (1280, 800)), path.name
            assert image.mode == "P", f"{path.name} is not a palette PNG: make console-docs writes them so"
        total += path.stat().st_size
    assert 0 < total <= BUDGET_BYTES, f"{total:,} bytes"

"""What messages, arguments and results become on a page (commonos.console.content): Markdown rendered with raw
HTML, images and unsafe links left as text, the rest cleaned by an allow-list; JSON that folds; long text folded;
Claude Code's command tags as a chip. Pure functions: their HTML is parsed here, never matched as a whole."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from commonos.console.content import (
    FOLD_LINES,
    JSON_TREE_LINES,
    agent_text,
    json_view,
    markdown,
    markdown_folded,
    result_view,
    safe_link,
)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text, of a fragment."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text += data

    def names(self) -> list[str]:
        return [t for t, _ in self.tags]

    def attributes(self) -> list[str]:
        return [name for _, attrs in self.tags for name in attrs]


HOSTILE = '<img src=x onerror="alert(1)"> <script>alert(2)</script> <a href="javascript:alert(3)">x</a>'


def test_raw_html_is_text() -> None:
    html = str(markdown(HOSTILE))
    parsed = Elements(html)
    assert parsed.names() == ["p"], html
    assert parsed.text.strip() == HOSTILE


@pytest.mark.parametrize(
    "link",
    [
        "javascript:alert(1)",
        "JavaScript:alert(1)",
        "javascript&#58;alert(1)",
        "java%73cript:alert(1)",
        " javascript:alert(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "vbscript:msgbox(1)",
        "file:///etc/passwd",
    ],
)
def test_an_unsafe_link_is_no_link(link: str) -> None:
    for text in (f"[click me]({link})", f"<{link}>", f"[ref]\n\n[ref]: {link}"):
        parsed = Elements(str(markdown(text)))
        hrefs = [a.get("href") for tag, a in parsed.tags if tag == "a"]
        assert hrefs == [], (text, hrefs)


def test_safe_links_images_and_headings() -> None:
    html = str(
        markdown("# Plan\n\n[docs](https://example.com/a?b=1) [here](/sessions) ![pixel](https://t.example/p.png)")
    )
    parsed = Elements(html)
    links = [a for tag, a in parsed.tags if tag == "a"]
    assert [a["href"] for a in links] == ["https://example.com/a?b=1", "/sessions", "https://t.example/p.png"]
    assert all(a["rel"] == "noopener noreferrer nofollow" for a in links)
    # No image is loaded (the policy refuses other sites' images; a tracking pixel stays a link), and a
    # message's heading sits below the page's own h1-h3.
    assert "img" not in parsed.names() and "h1" not in parsed.names() and "h4" in parsed.names()
    assert safe_link("mailto:a@example.com") and safe_link("#top") and not safe_link("JAVA\tSCRIPT:x")


def test_markdown_renders_and_keeps_no_style() -> None:
    text = "**bold** and `code`\n\n| a | b |\n|--:|---|\n| 1 | 2 |\n\n```python\nprint('<hi>')\n```\n\n- one\n- two"
    parsed = Elements(str(markdown(text)))
    for tag in ("strong", "code", "table", "th", "td", "pre", "ul", "li"):
        assert tag in parsed.names(), tag
    # Aligned columns would be inline styles (the policy refuses them): no style, no class, no event handler.
    assert set(parsed.attributes()) <= {"href", "rel", "title", "start"}, parsed.attributes()
    assert "print('<hi>')" in parsed.text


def test_long_text_is_folded_behind_its_first_line() -> None:
    short = str(markdown_folded("a short reply"))
    assert "details" not in Elements(short).names()
    long = "First line of a long reply\n" + "\n".join(f"line {n}" for n in range(FOLD_LINES + 5))
    parsed = Elements(str(markdown_folded(long)))
    assert parsed.names()[:2] == ["details", "summary"] and "open" not in parsed.tags[0][1]
    assert "First line of a long reply" in parsed.text and f"line {FOLD_LINES + 4}" in parsed.text
    assert f"show all {FOLD_LINES + 6} lines" in parsed.text


def test_json_small_as_text_large_as_a_tree_that_folds() -> None:
    small = Elements(str(json_view({"cmd": "rm -rf <tmp>"})))
    assert small.names() == ["pre"] and json.loads(small.text) == {"cmd": "rm -rf <tmp>"}
    large = {"rows": [{"day": d, "orders": d * 10} for d in range(JSON_TREE_LINES)], "note": "<b>x</b>"}
    parsed = Elements(str(json_view(large)))
    details = [attrs for tag, attrs in parsed.tags if tag == "details"]
    assert len(details) == 2 + JSON_TREE_LINES  # the object, its array, each row
    assert "open" in details[0] and "open" not in details[1]  # the top open, the long array folded
    assert '"<b>x</b>"' in parsed.text and "b" not in parsed.names()
    # A result that is JSON is shown as JSON; one that is not, as text.
    assert "details" in Elements(str(result_view(json.dumps(large)))).names()
    assert Elements(str(result_view("{not json"))).names() == ["pre"]


def test_claude_code_command_tags_become_a_chip() -> None:
    text = (
        "<command-message>orchestrator is running…</command-message>\n<command-name>/orchestrator</command-name>\n"
        "<command-args>create TODO app by <b>Next.js</b></command-args>"
    )
    html = str(agent_text(text))
    parsed = Elements(html)
    assert "<command-" not in html and "&lt;command-" not in html
    chip = next(attrs for tag, attrs in parsed.tags if attrs.get("class") == "command-chip")
    assert chip["title"] == "slash command /orchestrator: orchestrator is running…"
    assert "/orchestrator" in parsed.text and "create TODO app by <b>Next.js</b>" in parsed.text
    assert "b" not in parsed.names()
    # Command output and reminders are labelled blocks; what is left is Markdown.
    out = Elements(str(agent_text("<local-command-stdout>Compacted</local-command-stdout>\n**then** this")))
    assert "command output" in out.text and "Compacted" in out.text and "strong" in out.names()


def test_a_folded_reply_shows_its_first_line_as_read() -> None:
    long = "## **Plan** for [the site](https://example.com)\n" + "\n".join(f"- step {n}" for n in range(FOLD_LINES))
    summary = str(markdown_folded(long)).split("</summary>", 1)[0]
    assert "Plan for the site" in Elements(summary).text and "#" not in summary and "**" not in summary

"""What a message, a tool's arguments and its result look like on a page: Markdown, JSON, long text folded.

Everything here is attacker-controlled text (a user's message, a model's reply, a tool's output, an imported
transcript), turned into HTML that can run nothing:

* **Markdown** (`markdown`) is rendered by markdown-it-py with raw HTML off (a `<script>` or an `<img onerror>`
  in the text stays text), images off (a remote image would be a request the content security policy refuses,
  and a tracking pixel), links only to http(s), mailto and this site (`javascript:`, `data:` and the other
  schemes stay text), headings moved below the page's own (a `# Title` in a reply is an h4). The HTML is then
  cleaned by nh3 (ammonia) with an allow-list of tags and attributes, no `style` (the policy refuses inline
  styles) and `rel="noopener noreferrer nofollow"` on every link.
* **JSON** (`json_view`) is shown with its own characters (escaped as text): a small value as it is, a large
  one as a tree of `<details>` whose members fold.
* **Long text** (`fold`) shows its first line and opens on a click (`<details>`: no script).
* **Claude Code's wrappers** (`agent_text`): a slash command recorded as `<command-name>` /
  `<command-message>` / `<command-args>` becomes a command chip; its output (`<local-command-stdout>`,
  `<bash-stdout>`, ...) and `<system-reminder>` become labelled, folded blocks.

Pure functions of the text (no I/O), returning `markupsafe.Markup` for the templates.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final
from urllib.parse import unquote

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token
from markupsafe import Markup

#: Text longer than this (characters or lines) is folded: its first line shows, the rest on a click.
FOLD_CHARS: Final = 1500
FOLD_LINES: Final = 20
#: JSON whose indented form has more lines than this is shown as a tree that folds.
JSON_TREE_LINES: Final = 16
#: A member of a JSON tree whose indented form is longer than this many lines starts folded.
JSON_OPEN_LINES: Final = 8
#: The longest first line shown for a folded text.
PREVIEW_CHARS: Final = 160

#: The link schemes a rendered link may have; a link without a scheme (`/sessions/…`, `#x`) is this site's.
LINK_SCHEMES: Final = frozenset({"http", "https", "mailto"})
#: Characters browsers drop from a URL before reading its scheme (`java\tscript:` is `javascript:`).
_IGNORED_IN_URL: Final = re.compile(r"[\x00-\x20\x7f]+")

_TAGS: Final = {
    "p",
    "br",
    "hr",
    "h4",
    "h5",
    "h6",
    "strong",
    "em",
    "del",
    "s",
    "code",
    "pre",
    "blockquote",
    "ul",
    "ol",
    "li",
    "a",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
}
_ATTRIBUTES: Final = {"a": {"href", "title"}, "ol": {"start"}}


def safe_link(url: str) -> bool:
    """Whether a Markdown link may point at `url`: http(s), mailto or a URL of this site, never `javascript:`,
    `data:`, `vbscript:`, `file:` or any other scheme."""
    bare = _IGNORED_IN_URL.sub("", unquote(url)).lower()
    # A colon before the first /, ? or # ends a scheme (or makes the URL one no browser should guess at).
    head = re.split(r"[/?#]", bare, maxsplit=1)[0]
    return ":" not in head or head.split(":", 1)[0] in LINK_SCHEMES


def _make_markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.disable(["image"])
    md.validateLink = safe_link  # type: ignore[method-assign]

    def heading(renderer: Any, tokens: list[Token], idx: int, options: Any, env: Any) -> str:
        # The page's own headings are h1-h3: a message's start at h4.
        token = tokens[idx]
        token.tag = f"h{min(6, int(token.tag[1]) + 3)}"
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("heading_open", heading)
    md.add_render_rule("heading_close", heading)
    return md


_MARKDOWN: Final = _make_markdown()


def _clean(html: str) -> str:
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=set(LINK_SCHEMES),
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def markdown(text: str | None) -> Markup:
    """`text` as sanitized HTML: Markdown rendered, raw HTML shown as text, unsafe links left as text."""
    if not text:
        return Markup("")
    return Markup(_clean(_MARKDOWN.render(text)))


def is_long(text: str) -> bool:
    return len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES


def preview(text: str) -> str:
    """The first non-empty line of `text`, cut to PREVIEW_CHARS."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= PREVIEW_CHARS else first[: PREVIEW_CHARS - 1] + "…"


#: Markdown's marks at the start of a line (heading, quote, list item) and around words (bold, code, links).
_LINE_MARKS: Final = re.compile(r"^(?:#{1,6}\s+|>\s*|[-*+]\s+|\d+[.)]\s+)+")
_INLINE_MARKS: Final = re.compile(r"\*\*|__|~~|`")
_LINK: Final = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def plain_line(line: str) -> str:
    """A line of Markdown as a person reads it: `## **Plan** for [x](u)` is `Plan for x`."""
    return _INLINE_MARKS.sub("", _LINK.sub(r"\1", _LINE_MARKS.sub("", line.strip())))


def fold(body: Markup, text: str, *, what: str = "", first_line: str | None = None) -> Markup:
    """`body` (the HTML of `text`) as it is when `text` is short; else folded behind its first line
    (`first_line`, or the text's own)."""
    if not is_long(text):
        return body
    lines = text.count("\n") + 1
    size = f"{lines:,} lines" if lines > 1 else f"{len(text):,} characters"
    label = f"{what} · " if what else ""
    return Markup(
        '<details class="fold"><summary><span class="fold-preview">{preview}</span> '
        '<span class="fold-more muted">{label}show all {size}</span></summary>{body}</details>'
    ).format(preview=first_line if first_line is not None else preview(text), label=label, size=size, body=body)


def markdown_folded(text: str | None) -> Markup:
    """A message's text: Markdown, folded when long."""
    if not text:
        return Markup("")
    return fold(Markup('<div class="md">{}</div>').format(markdown(text)), text, first_line=plain_line(preview(text)))


def plain_folded(text: str | None, *, what: str = "") -> Markup:
    """Text as it is (tool output: whitespace kept), in a <pre>, folded when long."""
    if text is None or text == "":
        return Markup("")
    return fold(Markup("<pre>{}</pre>").format(text), text, what=what)


# JSON.


def pretty_json(value: Any) -> str:
    """JSON for a person to read, its own characters kept: autoescaping then makes it safe in HTML (Jinja's
    `tojson` is for scripts: it writes `<`, `>` and `&` as `\\u003c`, which a reader would see)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def json_view(value: Any) -> Markup:
    """A JSON value: as indented text when short; else a tree whose objects and arrays fold (the large ones
    start folded)."""
    text = pretty_json(value)
    if text.count("\n") < JSON_TREE_LINES or not isinstance(value, dict | list):
        return fold(Markup('<pre class="json">{}</pre>').format(text), text, what="JSON")
    return Markup('<div class="json-tree">{}</div>').format(_node(value, None, top=True))


def _member(key: str | None) -> Markup:
    if key is None:
        return Markup("")
    return Markup('<span class="json-key">{}</span>: ').format(json.dumps(key, ensure_ascii=False))


def _node(value: Any, key: str | None, *, top: bool = False) -> Markup:
    if isinstance(value, dict | list) and value:
        is_object = isinstance(value, dict)
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        count = len(value)
        noun = ("key" if is_object else "item") + ("" if count == 1 else "s")
        opened = top or pretty_json(value).count("\n") <= JSON_OPEN_LINES
        children = Markup("").join(Markup("<li>{}</li>").format(_node(v, k)) for k, v in items)
        return Markup(
            '<details class="json-node"{open}><summary>{member}{start}<span class="json-count muted">{count} {noun}'
            "</span></summary><ul>{children}</ul>{end}</details>"
        ).format(
            open=Markup(" open") if opened else "",
            member=_member(key),
            start="{" if is_object else "[",
            count=count,
            noun=noun,
            children=children,
            end="}" if is_object else "]",
        )
    text = json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, str) and ("\n" in value or len(value) > PREVIEW_CHARS):
        # A long string (a file, a command's output) reads better as the text it holds.
        return Markup("{member}{body}").format(member=_member(key), body=plain_folded(value, what="string"))
    return Markup('{member}<span class="json-value">{text}</span>').format(member=_member(key), text=text)


def result_view(text: str | None) -> Markup:
    """A tool's result: JSON as JSON (an object or array), anything else as text; folded when long."""
    if text is None or text == "":
        return Markup("")
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            return json_view(parsed)
    return plain_folded(text, what="result")


# Claude Code's own markup in a transcript's user turns.

#: A slash command: `<command-message>review is running…</command-message><command-name>/review</command-name>
#: <command-args>the diff</command-args>`.
_COMMAND_TAGS: Final = ("command-name", "command-message", "command-args")
#: What Claude Code writes around a command's or a shell's output, and its reminders to the model.
_BLOCK_TAGS: Final = {
    "local-command-stdout": "command output",
    "local-command-stderr": "command errors",
    "bash-input": "shell input",
    "bash-stdout": "shell output",
    "bash-stderr": "shell errors",
    "system-reminder": "system reminder",
}
_WRAPPER: Final = re.compile(
    r"<(?P<tag>" + "|".join(map(re.escape, (*_COMMAND_TAGS, *_BLOCK_TAGS))) + r")>(?P<body>.*?)</(?P=tag)>",
    re.DOTALL,
)


def agent_text(text: str | None) -> Markup:
    """A transcript's user turn: its slash command as a chip, command output and reminders as labelled blocks
    (folded when long), the rest as Markdown (folded when long)."""
    if not text:
        return Markup("")
    command: dict[str, str] = {}
    parts: list[Markup] = []
    rest: list[str] = []
    cursor = 0
    for found in _WRAPPER.finditer(text):
        rest.append(text[cursor : found.start()])
        cursor = found.end()
        tag, body = found.group("tag"), found.group("body").strip()
        if tag in _COMMAND_TAGS:
            command.setdefault(tag, body)
        elif body:
            label = _BLOCK_TAGS[tag]
            parts.append(
                Markup('<div class="agent-block"><div class="agent-block-label muted">{}</div>{}</div>').format(
                    label, plain_folded(body, what=label)
                )
            )
    rest.append(text[cursor:])
    remainder = "".join(rest).strip()
    out: list[Markup] = []
    if command:
        out.append(command_chip(command))
    out.extend(parts)
    if remainder:
        out.append(markdown_folded(remainder))
    return Markup("").join(out)


def command_chip(command: dict[str, str]) -> Markup:
    """A slash command as one chip: its name and arguments; the status line Claude Code showed as its title."""
    name = command.get("command-name") or "command"
    if not name.startswith("/"):
        name = "/" + name
    args = command.get("command-args", "")
    message = command.get("command-message", "")
    title = f"slash command {name}" + (f": {message}" if message else "")
    chip = Markup(
        '<span class="command-chip" title="{title}"><span class="command-label">command</span> '
        '<code class="command-name">{name}</code>'
    ).format(title=title, name=name)
    if args:
        chip += Markup(' <span class="command-args">{}</span>').format(
            args if len(args) <= FOLD_CHARS else preview(args)
        )
    chip += Markup("</span>")
    if len(args) > FOLD_CHARS:
        chip += plain_folded(args, what="arguments")
    return chip


__all__ = [
    "agent_text",
    "fold",
    "json_view",
    "markdown",
    "markdown_folded",
    "plain_folded",
    "pretty_json",
    "result_view",
    "safe_link",
]

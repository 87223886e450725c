"""Cutting a row too large for any message down to size, with a marker saying so.

A graph too large for one message is published in parts, each under a byte budget (see
`publish`). A row larger than a whole part on its own (a 5 MB tool result, a log pasted as a
prompt) cannot travel whole; rather than lose the session, its large text and JSON fields are cut,
largest first, until the row fits:

* a text field keeps as much of its beginning as fits, followed by a line
  ``[cos_import_cut: <N> bytes in all, cut to fit one message]`` (N: the whole text's UTF-8 bytes);
* a JSON field becomes ``{"cos_import_cut": {"original_bytes": N, "head": "<the beginning of its
  JSON text>"}}`` (a tool call's metadata keeps its ``subagent_detail`` beside it);
* a file touch's hunks keep their positions and line counts, and their lines give way to one line
  ``[cos_import_cut: <N> bytes of hunk lines, cut to fit one message]``.

Ids, references, statuses, times, paths, model names and token counts are never cut, so what a
session cost is never affected. A cut is deterministic: importing the same transcript again cuts
the same rows the same way.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.graph import SUBAGENT_DETAIL_KEY, Hunk

#: The word every cut carries, so a cut value can be found (`WHERE output ? 'cos_import_cut'`).
CUT_KEY: Final = "cos_import_cut"

#: The fields that may be cut, per graph list, with how: ``text``, ``json`` or ``hunks``.
CUTTABLE: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "sessions": (
        ("title", "text"),
        ("working_dir", "text"),
        ("git_branch", "text"),
        ("repo_root", "text"),
        ("worktree_root", "text"),
    ),
    "attributes": (("value", "json"),),
    "user_inputs": (("text", "text"), ("metadata", "json")),
    "assistant_messages": (("text", "text"), ("content", "json")),
    "tool_uses": (("input", "json"), ("metadata", "json")),
    "tool_results": (("output_text", "text"), ("output", "json"), ("error_text", "text")),
    "file_touches": (("hunks", "hunks"),),
}

#: A row of each graph list, in words.
SINGULAR: Final = {
    "sessions": "session",
    "attributes": "session attribute",
    "user_inputs": "user input",
    "model_invocations": "model invocation",
    "assistant_messages": "assistant message",
    "tool_uses": "tool use",
    "tool_results": "tool result",
    "file_touches": "file touch",
    "token_usage": "token usage row",
    "vendor_ids": "vendor id",
}

_encoder: Final = msgspec.json.Encoder()


class RowTooLarge(DataError):
    """A row that does not fit a part even with every field that may be cut cut; the message says which."""


def text_marker(original_bytes: int) -> str:
    """What ends a cut text field."""
    return f"\n[{CUT_KEY}: {original_bytes} bytes in all, cut to fit one message]"


def hunks_marker(original_bytes: int) -> str:
    """The one line left of a file touch's cut hunk lines."""
    return f"[{CUT_KEY}: {original_bytes} bytes of hunk lines, cut to fit one message]"


def is_cut(value: Any) -> bool:
    """Whether a field value (text, raw JSON or hunks) carries a cut marker."""
    if value is None:
        return False
    if isinstance(value, str):
        return f"[{CUT_KEY}: " in value
    if isinstance(value, msgspec.Raw):
        return bytes(value).startswith(b'{"' + CUT_KEY.encode() + b'":')
    if isinstance(value, list):
        return any(isinstance(h, Hunk) and h.lines and h.lines[-1].startswith(f"[{CUT_KEY}: ") for h in value)
    return False


def _size(value: Any) -> int:
    return len(_encoder.encode(value))


def row_size(row: Any) -> int:
    """Bytes `row` takes in an event, which carries its graph decoded and encoded again."""
    return len(_encoder.encode(msgspec.json.decode(_encoder.encode(row))))


def _prefix_within(text: str, limit: int) -> str:
    """The longest beginning of `text` whose JSON string encoding takes at most `limit` bytes."""
    if limit <= 2:
        return ""
    # Every character takes at least one byte inside the quotes, so `limit` characters is a bound.
    low, high = 0, min(len(text), limit)
    if _size(text[:high]) <= limit:
        return text[:high]
    while low < high:  # the largest k with size(text[:k]) <= limit
        middle = (low + high + 1) // 2
        if _size(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _cut_text(text: str, allowed: int) -> str:
    marker = text_marker(len(text.encode("utf-8", "surrogatepass")))
    # Encoded, prefix + marker is the two encodings less one pair of quotes.
    return _prefix_within(text, allowed - _size(marker) + 2) + marker


def _cut_json(raw: msgspec.Raw, allowed: int, keep: dict[str, Any]) -> msgspec.Raw:
    data = bytes(raw)
    head = data.decode("utf-8", "replace")
    shell: dict[str, Any] = {CUT_KEY: {"original_bytes": len(data), "head": ""}, **keep}
    room = allowed - _size(shell) + 2
    shell[CUT_KEY]["head"] = _prefix_within(head, room)
    return msgspec.Raw(_encoder.encode(shell))


def _kept_keys(list_name: str, field: str, raw: msgspec.Raw) -> dict[str, Any]:
    """What a cut JSON field keeps beside the marker: a tool call's subagent detail."""
    if list_name != "tool_uses" or field != "metadata":
        return {}
    try:
        decoded = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {}
    if isinstance(decoded, dict) and isinstance(decoded.get(SUBAGENT_DETAIL_KEY), str):
        return {SUBAGENT_DETAIL_KEY: decoded[SUBAGENT_DETAIL_KEY]}
    return {}


def _cut_hunks(hunks: list[Hunk]) -> list[Hunk]:
    lines_bytes = sum(len(line.encode("utf-8", "surrogatepass")) for h in hunks for line in h.lines or ())
    cut = [msgspec.structs.replace(h, lines=None) for h in hunks]
    if cut:
        cut[0] = msgspec.structs.replace(cut[0], lines=[hunks_marker(lines_bytes)])
    return cut


def cut_row(list_name: str, row: Any, capacity: int) -> tuple[Any, bool]:
    """`row`, or a copy whose large fields are cut so that its JSON takes at most `capacity` bytes.

    Returns the row and whether it was cut; raises RowTooLarge when even a cut row does not fit.
    """
    size = row_size(row)
    if size <= capacity:
        return row, False
    fields = [(name, kind) for name, kind in CUTTABLE.get(list_name, ()) if getattr(row, name) is not None]
    field_sizes = {name: _size(getattr(row, name)) for name, _ in fields}
    changed = False
    for name, kind in sorted(fields, key=lambda f: -field_sizes[f[0]]):
        excess = size - capacity
        if excess <= 0:
            break
        value = getattr(row, name)
        allowed = max(0, field_sizes[name] - excess)
        new: Any
        if kind == "text":
            new = _cut_text(value, allowed)
        elif kind == "json":
            new = _cut_json(value, allowed, _kept_keys(list_name, name, value))
        else:
            new = _cut_hunks(value)
        if _size(new) >= field_sizes[name]:
            continue  # already smaller than its marker would be
        row = msgspec.structs.replace(row, **{name: new})
        size = row_size(row)
        changed = True
    if size > capacity:
        what = SINGULAR.get(list_name, list_name)
        which = getattr(row, "id", None) or getattr(row, "vendor_id", "")
        raise RowTooLarge(
            f"a {what} ({which}) takes {size} bytes even with its text cut, "
            f"more than the {capacity} bytes a part has room for (raise the NATS server's max_payload)"
        )
    return row, changed

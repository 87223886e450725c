"""Hypothesis strategies for bad input of every kind the system reads from outside.

Each strategy mixes valid input, structured mutations of valid input (a field dropped or given the
wrong type, huge strings, deep nesting, invalid UTF-8, unknown fields and types) and raw noise, so a
target sees both the near-misses that get deep into the code and the garbage it must turn away at
the door.

Nothing is left out for a known bug: every bug the targets found is fixed and kept as its smallest
failing example in `test_regressions.py` / `test_regressions_second_round.py`. A bug found and not
fixed at once is pinned there as a strict xfail, and the strategy that draws it is left as it is.
"""

from __future__ import annotations

import copy
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from functools import cache
from typing import Any, Final

import msgspec
from hypothesis import strategies as st

from commonos.loop.profiles import BUILTIN_TOOLS, PROVIDERS
from commonos.proto import events as ev
from commonos.proto import graph as g
from commonos.proto.cloudevents import MSG_ID, event_headers
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

#: Nesting far past the interpreter's recursion limit, wherever a parser starts.
DEPTH: Final = 100_000
TOML_DEPTH: Final = 5_000

JSON = Any

# --- text ------------------------------------------------------------------------------------------------

#: What `str.splitlines` breaks a line at.
LINE_BREAKS: Final = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
#: Any text a JSON document can carry encoded as UTF-8 (no lone surrogates).
unicode_text = st.text(st.characters(codec="utf-8"), max_size=40)
#: Text as it may reach us from a lenient encoder: lone surrogates included.
any_text = st.text(max_size=40)
#: Characters that trip up hand-written validation: controls, separators, confusables, escapes.
_NASTY_CHARS: Final = (
    "\x00",
    "\n",
    "\r",
    "\t",
    " ",
    "\u00a0",
    "\u2028",
    "\u200b",
    "\ufeff",
    "%",
    "%00",
    "%ff",
    "%C3%28",
    ":",
    ".",
    "*",
    ">",
    "/",
    "\\",
    '"',
    "'",
    "{",
    "}",
    ",",
    "İ",
    "ß",
    "K",
    "é",
    "😀",
)
nasty_text = st.lists(st.sampled_from(_NASTY_CHARS) | unicode_text, max_size=5).map("".join)


@st.composite
def huge_text(draw: st.DrawFn) -> str:
    """A long string, built rather than drawn so it costs nothing to generate."""
    unit = draw(st.sampled_from(["x", "é", "😀", "a:b", "\\", "%", " "]))
    size = draw(st.sampled_from([4096, 65_536, 1_000_000]))  # bytes once JSON-escaped, about
    return unit * (size // len(json.dumps(unit)))


@st.composite
def _texts(draw: st.DrawFn, huge: bool) -> str:
    if huge and draw(st.integers(0, 15)) == 0:
        return draw(huge_text())
    return draw(st.one_of(unicode_text, nasty_text, any_text))


@cache
def texts(*, huge: bool = True) -> st.SearchStrategy[str]:
    """Any text, one time in sixteen a huge one (when `huge`)."""
    return _texts(huge)


# --- JSON ------------------------------------------------------------------------------------------------

#: Integers at the edges of the widths that code and databases use.
EDGE_INTS: Final = (
    -1,
    0,
    1,
    2**15,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**31) - 1,
    -(2**63) - 1,
    10**30,
)
edge_ints = st.sampled_from(EDGE_INTS) | st.integers()


@cache
def json_scalars(*, strict: bool = False) -> st.SearchStrategy[JSON]:
    """Scalars; `strict` keeps to what a JSON encoder that refuses NaN and lone surrogates accepts."""
    floats = st.floats(allow_nan=not strict, allow_infinity=not strict)
    ints = st.integers(-(2**63), 2**64 - 1) if strict else edge_ints
    return st.none() | st.booleans() | ints | floats | (unicode_text if strict else texts(huge=False))


@cache
def json_values(*, strict: bool = False, max_leaves: int = 12) -> st.SearchStrategy[JSON]:
    return st.recursive(
        json_scalars(strict=strict),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(unicode_text if strict else texts(huge=False), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


@cache
def json_objects(*, strict: bool = False) -> st.SearchStrategy[dict[str, JSON]]:
    return st.dictionaries(unicode_text, json_values(strict=strict, max_leaves=8), max_size=4)


#: Where `dump_json` puts a deeply nested value (json.dumps itself would recurse).
_DEEP_MARK: Final = "\x01cos-fuzz-deep\x01"


@dataclass(frozen=True)
class Deep:
    """A JSON value nested `depth` levels deep, rendered straight to bytes."""

    depth: int
    kind: str  # "array" | "object" | "mixed"

    def render(self) -> bytes:
        if self.kind == "array":
            return b"[" * self.depth + b"]" * self.depth
        if self.kind == "object":
            return b'{"a":' * self.depth + b"1" + b"}" * self.depth
        half = self.depth // 2
        return b'{"a":[' * half + b"null" + b"]}" * half


#: Deep nesting of any depth, the depths that break parsers drawn often.
deep_values = st.builds(
    Deep, st.integers(1, DEPTH) | st.sampled_from([1_000, 10_000, DEPTH]), st.sampled_from(["array", "object", "mixed"])
)


def dump_json(value: JSON, *, ensure_ascii: bool = True) -> bytes:
    """Encode like a lenient producer: NaN, huge ints and surrogates as they come, `Deep` inlined.

    With `ensure_ascii=False` a lone surrogate becomes the CESU-8 bytes a careless encoder writes,
    which is invalid UTF-8.
    """
    deep: list[Deep] = []

    def swap(v: JSON) -> JSON:
        if isinstance(v, Deep):
            deep.append(v)
            return _DEEP_MARK
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=ensure_ascii, allow_nan=True)
    out = text.encode("utf-8", "surrogatepass")
    mark = json.dumps(_DEEP_MARK).encode()
    for d in deep:
        out = out.replace(mark, d.render(), 1)
    return out


# --- byte-level damage ----------------------------------------------------------------------------------

INVALID_UTF8: Final = (
    b"\xff",
    b"\xfe\xff",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xe2\x28\xa1",
    b"\xf0\x28\x8c\x28",
    b"\xed\xa0\x80",
)


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with one kind of damage: truncated, invalid UTF-8 spliced in, a byte flipped, or nothing."""
    how = draw(st.sampled_from(["none", "truncate", "utf8", "flip", "append"]))
    if not data or how == "none":
        return data
    at = draw(st.integers(0, len(data)))
    if how == "truncate":
        return data[:at]
    if how == "utf8":
        return data[:at] + draw(st.sampled_from(INVALID_UTF8)) + data[at:]
    if how == "flip":
        i = min(at, len(data) - 1)
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return data + draw(st.binary(max_size=16))


# --- events ----------------------------------------------------------------------------------------------

TAG_BODY: Final = r"[a-z0-9_-]{1,12}:[A-Za-z0-9_.-]{1,12}"
PROFILE_BODY: Final = r"[a-z0-9_-]{1,20}"

valid_tags = st.from_regex(TAG_BODY, fullmatch=True)
valid_profile_ids = st.from_regex(PROFILE_BODY, fullmatch=True)
#: Sane instants: aware, well inside every range a database or a datetime can hold.
aware_datetimes = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
) | st.builds(
    lambda d, minutes: d.replace(tzinfo=timezone(timedelta(minutes=minutes))),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)),
    st.integers(-23 * 60, 23 * 60),
)
strict_objects = json_objects(strict=True)
_text = unicode_text


@cache
def _message_contents() -> st.SearchStrategy[UserMessage | AssistantMessage | ToolResultMessage]:
    calls = st.builds(ToolCall, id=_text, name=_text, args=strict_objects)
    return st.one_of(
        st.builds(UserMessage, text=_text),
        st.builds(AssistantMessage, text=st.none() | _text, tool_calls=st.lists(calls, max_size=2).map(tuple)),
        st.builds(ToolResultMessage, call_id=_text, content=_text, is_error=st.booleans()),
    )


@cache
def _event_kwargs() -> dict[str, st.SearchStrategy[Any]]:
    return {
        "event_id": st.uuids(),
        "occurred_at": aware_datetimes,
        "profile_id": valid_profile_ids,
        "session_id": st.uuids(),
    }


@cache
def _tags() -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(valid_tags, max_size=3, unique=True).map(tuple)


@cache
def valid_events() -> st.SearchStrategy[ev.Event]:
    """One well-formed event of any type, with fresh ids (it references nothing that exists)."""
    common = _event_kwargs()
    counts = st.integers(0, 2**31 - 1)
    return st.one_of(
        st.builds(ev.ProfileUpserted, **common, tags=_tags()),
        st.builds(
            ev.SessionCreated,
            **common,
            source=_text,
            title=st.none() | _text,
            tags=_tags(),
            parent_session_id=st.none() | st.uuids(),
        ),
        st.builds(
            ev.TurnStarted,
            **common,
            turn_id=st.uuids(),
            parent_turn_id=st.none() | st.uuids(),
            tags=_tags(),
            depth=st.integers(0, 5),
            context_snapshot=st.none() | strict_objects,
        ),
        st.builds(
            ev.MessageAppended,
            **common,
            turn_id=st.uuids(),
            message_id=st.uuids(),
            seq=st.integers(1, 10_000),
            content=_message_contents(),
        ),
        st.builds(ev.MessageDeactivated, **common, message_ids=st.lists(st.uuids(), max_size=3).map(tuple)),
        st.builds(
            ev.ToolCallRecorded,
            **common,
            turn_id=st.uuids(),
            tool_call_id=st.uuids(),
            call_id=_text,
            name=_text,
            args=strict_objects,
            result=st.none() | _text,
            is_error=st.booleans(),
            risk=st.sampled_from(ev.Risk),
            started_at=aware_datetimes,
            finished_at=aware_datetimes,
            approval=st.none() | st.sampled_from(ev.ApprovalStatus),
        ),
        st.builds(
            ev.ApprovalDecided,
            **common,
            turn_id=st.uuids(),
            tool_call_id=st.uuids(),
            call_id=_text,
            status=st.sampled_from(ev.ApprovalStatus),
            decided_at=aware_datetimes,
            decided_by=_text,
        ),
        st.builds(
            ev.MemoryChanged,
            **common,
            turn_id=st.none() | st.uuids(),
            target=st.sampled_from(ev.MemoryTarget),
            op=st.sampled_from(ev.MemoryOp),
            position=counts,
            content=st.none() | _text,
        ),
        st.builds(
            ev.ModelCallCompleted,
            **common,
            turn_id=st.none() | st.uuids(),
            provider=_text,
            model=_text,
            input_tokens=counts,
            output_tokens=counts,
            cache_read_tokens=counts,
            reasoning_tokens=counts,
            latency_s=st.none() | st.floats(0, 1e6),
            tags=_tags(),
            reported_cost_usd=st.none() | st.decimals(0, 1000, places=6),
        ),
        st.builds(
            ev.TurnFinished,
            **common,
            turn_id=st.uuids(),
            status=st.sampled_from(ev.TurnStatus),
            error=st.none() | _text,
        ),
        st.builds(
            ev.TranscriptImported,
            **common,
            vendor=_text,
            source_ref=st.none() | _text,
            tags=_tags(),
            graph=st.just(g.Graph()) | valid_graphs().map(lambda doc: g.decode_graph(dump_json(doc))),
        ),
    )


#: Values at the edges of what each kind of field accepts: wrong types, ranges, formats.
EDGE_VALUES: Final[tuple[JSON, ...]] = (
    None,
    True,
    "",
    " ",
    "\x00",
    [],
    {},
    -1,
    0,
    2**31,
    2**63,
    2**64,
    10**40,
    1.5,
    1e308,
    "NaN",
    "Infinity",
    "-0",
    "1e999999",
    "0001-01-01T00:00:00+05:00",
    "9999-12-31T23:59:59-05:00",
    "0001-01-01T00:00:00Z",
    "2026-02-30T10:00:00Z",
    "2026-01-01T00:00:00",
    "2026-01-01",
    "not-a-uuid",
    "00000000-0000-0000-0000-000000000000",
    "{01a2b3c4-0000-7000-8000-000000000000}",
    "01A2B3C4-0000-7000-8000-000000000000",
    "a:b\n",
    "default\n",
    "A:b",
    "a:b:c",
    "x" * 65,
    "running",
    "user",
    "tool_result",
)


def _paths(doc: JSON, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every path to a value inside `doc` (dict keys and list indexes)."""
    out: list[tuple[str | int, ...]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _container(doc: JSON, path: tuple[str | int, ...]) -> Any:
    for step in path[:-1]:
        doc = doc[step]
    return doc


MUTATIONS: Final = ("drop", "retype", "edge", "huge", "deep", "unknown_field", "unknown_type", "other_type")


@st.composite
def mutated(draw: st.DrawFn, doc: dict[str, JSON]) -> dict[str, JSON]:
    """`doc` (a decoded JSON object) with 0 to 3 structural mutations anywhere inside it."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(MUTATIONS))
        paths = _paths(doc)
        if op in ("unknown_field",) or not paths:
            key = draw(st.sampled_from(["zzz", "Type", "type ", "__proto__", "event_id2", ""]) | unicode_text)
            doc[key] = draw(json_values())
            continue
        if op == "unknown_type":
            doc["type"] = draw(
                st.sampled_from(["no_such_type", "", "SESSION_CREATED", "session_created_v2"]) | any_text
            )
            continue
        if op == "other_type":
            doc["type"] = draw(st.sampled_from(sorted(ev.EVENT_TYPE_NAMES)))
            continue
        path = draw(st.sampled_from(paths))
        parent = _container(doc, path)
        last = path[-1]
        if op == "drop":
            del parent[last]
        elif op == "retype":
            parent[last] = draw(json_values())
        elif op == "edge":
            parent[last] = draw(st.sampled_from(EDGE_VALUES))
        elif op == "huge":
            parent[last] = draw(huge_text())
        else:
            parent[last] = draw(deep_values)
    return doc


def _as_doc(event: ev.Event) -> dict[str, JSON]:
    doc: dict[str, JSON] = json.loads(ev.encode_event(event))
    return doc


@st.composite
def event_payloads(draw: st.DrawFn) -> bytes:
    """A payload on an event subject: valid, a mutated event, damaged bytes, or noise."""
    mode = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "raw", "json"]))
    if mode == "raw":
        return draw(st.binary(max_size=512))
    if mode == "json":
        return dump_json(draw(json_values() | deep_values))
    event = draw(valid_events())
    if mode == "valid":
        return ev.encode_event(event)
    doc = draw(mutated(_as_doc(event)))
    return draw(damaged(dump_json(doc, ensure_ascii=draw(st.booleans()))))


# --- headers and subjects --------------------------------------------------------------------------------

CE_HEADERS: Final = ("ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-subject")
PERCENT_JUNK: Final = ("%", "%2", "%zz", "%ff", "%C3%28", "%E2%82", "%00", "%25", "%20", "%e2%82%ac", "%ED%A0%80")


@st.composite
def header_values(draw: st.DrawFn, *, safe: bool) -> str:
    """A header value; `safe` keeps to what survives a NATS round trip unchanged (printable, no spaces)."""
    if safe:
        alphabet = st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.characters(
            min_codepoint=0xA1, codec="utf-8"
        ).filter(lambda c: c.isprintable() and not c.isspace())
        parts = st.text(alphabet, max_size=20) | st.sampled_from(PERCENT_JUNK)
    else:
        parts = texts(huge=False) | st.sampled_from(PERCENT_JUNK)
    return "".join(draw(st.lists(parts, max_size=3)))


@st.composite
def headers_for(draw: st.DrawFn, event: ev.Event | None, *, safe: bool = False) -> dict[str, str] | None:
    """Headers for a delivery: the event's own, mutated, or junk; None and empty included."""
    mode = draw(st.sampled_from(["none", "own", "mutated", "mutated", "junk"]))
    if mode == "none":
        return draw(st.sampled_from([None, {}]))
    name = st.sampled_from([*CE_HEADERS, "content-type", MSG_ID, "Ce-Id", "x-other", "Status"]) | st.from_regex(
        r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True
    )
    if mode == "junk" or event is None:
        return draw(st.dictionaries(name, header_values(safe=safe), max_size=6))
    headers = event_headers(event)
    if mode == "mutated":
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["drop", "set", "spec", "id", "type", "add"]))
            key = draw(st.sampled_from(sorted(headers))) if headers else "ce-id"
            if op == "drop":
                headers.pop(key, None)
            elif op == "set":
                headers[key] = draw(header_values(safe=safe))
            elif op == "spec":
                headers["ce-specversion"] = draw(st.sampled_from(["0.3", "1.0 ", "", "1.1", "%31.0"]))
            elif op == "id":
                headers["ce-id"] = draw(st.sampled_from([str(uuid.uuid4()), "", "%zz", headers.get("ce-id", "")]))
            elif op == "type":
                headers["ce-type"] = draw(
                    st.sampled_from(["cos.session_created.v1", "cos.nope.v1", "cos.turn_started.v2", "", "%ff"])
                )
            else:
                headers[draw(name)] = draw(header_values(safe=safe))
    if safe:  # NATS trims the whitespace around a header value
        headers = {k: v.strip(" \t\r\n\x0b\x0c") for k, v in headers.items()}
    return headers


SUBJECT_TOKEN: Final = r"[A-Za-z0-9_:%~!@#$^&()=+{}\[\]|;'\",?-]{1,20}"


@cache
def _subject_tokens() -> st.SearchStrategy[str]:
    return st.from_regex(SUBJECT_TOKEN, fullmatch=True) | st.sampled_from(
        ["default", "ops", *sorted(ev.EVENT_TYPE_NAMES), str(uuid.UUID(int=0)), "00000000000000000000000000000000"]
    )


def subject_for_doc(doc: Mapping[str, JSON]) -> str:
    """The subject a producer would derive from a (possibly mutated) event document."""
    return f"cos.events.{doc.get('profile_id')}.{doc.get('session_id')}.{doc.get('type')}"


@st.composite
def event_subjects(draw: st.DrawFn, payload: bytes) -> str:
    """A subject under `cos.events.`: agreeing with the payload, disagreeing, or malformed."""
    mode = draw(st.sampled_from(["agree", "agree", "tokens", "short", "long"]))
    if mode == "agree":
        try:
            doc = json.loads(payload)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            subject = subject_for_doc(doc)
            if re.fullmatch(r"cos\.events\.[^.\s*>]+\.[^.\s*>]+\.[^.\s*>]+", subject) and subject.isascii():
                return subject
    count = {"agree": 3, "tokens": 3, "short": draw(st.integers(0, 2)), "long": draw(st.integers(4, 6))}[mode]
    tokens = draw(st.lists(_subject_tokens(), min_size=count, max_size=count))
    return ".".join(["cos", "events", *tokens])


@dataclass(frozen=True)
class RawDelivery:
    subject: str
    data: bytes
    headers: dict[str, str] | None


@st.composite
def deliveries(draw: st.DrawFn, *, for_nats: bool = False) -> RawDelivery:
    """A delivery on `cos.events.>`: payload, subject and headers each valid, near-valid or junk.

    `for_nats` keeps to what nats-server stores and hands back unchanged: printable header values
    without spaces, subjects and payloads within the server's limits.
    """
    payload = draw(event_payloads())
    if for_nats:
        payload = payload[: 256 * 1024]
    try:
        event: ev.Event | None = ev.decode_event(payload)
    except (ev.EventDecodeError, RecursionError):
        event = None
    if event is None and draw(st.booleans()):
        event = draw(valid_events())
    subject = draw(event_subjects(payload))
    if for_nats and len(subject) > 1024:  # past nats-server's 4 KB control line the server drops the client
        subject = draw(event_subjects(b""))
    headers = draw(headers_for(event, safe=for_nats))
    return RawDelivery(subject, payload, headers)


# --- subjects, tags and profile ids as strings -----------------------------------------------------------


@st.composite
def near_valid(draw: st.DrawFn, valid: st.SearchStrategy[str]) -> str:
    """A valid value with one character inserted, replaced or case-flipped."""
    value = draw(valid)
    at = draw(st.integers(0, len(value)))
    how = draw(st.sampled_from(["insert", "replace", "upper", "append"]))
    char = draw(st.sampled_from(_NASTY_CHARS) | st.characters())
    if how == "insert":
        return value[:at] + char + value[at:]
    if how == "replace":
        return value[:at] + char + value[at + 1 :]
    if how == "upper":
        return value.upper()
    return value + char


#: Subject strings handed to `parse_subject`: valid, one character off, or any text.
valid_subjects = st.builds(
    lambda profile, session, kind: f"cos.events.{profile}.{session}.{kind}",
    valid_profile_ids,
    st.uuids(),
    st.sampled_from(sorted(ev.EVENT_TYPE_NAMES)),
)
subject_strings = st.one_of(
    valid_subjects,
    near_valid(valid_subjects),
    any_text,
    st.lists(_subject_tokens() | any_text, max_size=7).map(".".join),
    st.lists(_subject_tokens() | any_text, max_size=4).map(lambda t: ".".join(["cos", "events", *t])),
)
tag_strings = st.one_of(valid_tags, near_valid(valid_tags), any_text, nasty_text, huge_text())
profile_id_strings = st.one_of(
    valid_profile_ids,
    near_valid(valid_profile_ids),
    st.from_regex(r"[a-z0-9_-]{60,70}", fullmatch=True),
    any_text,
    nasty_text,
)


# --- TOML ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """Rendered as a `[name]` section."""

    items: dict[str, Any]


@dataclass(frozen=True)
class TableArray:
    """Rendered as `[[name]]` sections."""

    tables: list[dict[str, Any]]


@dataclass(frozen=True)
class RawToml:
    """A value written verbatim (a bare date, a broken literal, deep nesting)."""

    text: str


def _toml_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def toml_value(value: Any) -> str:
    if isinstance(value, RawToml):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Table):
        return toml_value(value.items)
    if isinstance(value, TableArray):
        return toml_value(value.tables)
    raise TypeError(f"no TOML for {value!r}")


def toml_document(doc: Mapping[str, Any]) -> str:
    """Top-level keys first, then `[table]` and `[[array]]` sections."""
    lines = [f"{_toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, Table | TableArray)]
    for key, value in doc.items():
        if isinstance(value, Table):
            lines += ["", f"[{_toml_key(key)}]"]
            lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items.items()]
        elif isinstance(value, TableArray):
            for table in value.tables:
                lines += ["", f"[[{_toml_key(key)}]]"]
                lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


@cache
def toml_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(),
        texts(huge=False),
        st.datetimes(timezones=st.none() | st.just(UTC)),
        st.dates(),
        st.times(),
        st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: RawToml(_toml_decimal(d))),
    )


def _toml_decimal(d: Decimal) -> str:
    """A Decimal as a TOML float literal where one exists, else as a string."""
    text = format(d, "f") if abs(d.adjusted()) < 30 else str(d)
    return text if re.fullmatch(r"[+-]?\d+\.\d+", text) else _toml_string(text)


@cache
def toml_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        toml_scalars(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(unicode_text, inner, max_size=3),
        max_leaves=8,
    )


@cache
def deep_toml() -> st.SearchStrategy[RawToml]:
    return st.builds(
        lambda depth, kind: RawToml("[" * depth + "]" * depth if kind else "{a = " * depth + "1" + "}" * depth),
        st.integers(1, TOML_DEPTH),
        st.booleans(),
    )


Field = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]


@st.composite
def field(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """Mostly a good value; else a bad one for the field, any TOML value (a wrong type), or deep nesting."""
    pick = draw(st.integers(0, 15))
    if pick == 0:
        return draw(toml_values())
    if pick == 1:
        return draw(deep_toml())
    if pick == 2:
        return draw(bad)
    return draw(good)


@st.composite
def optional_fields(draw: st.DrawFn, fields: Mapping[str, Field]) -> dict[str, Any]:
    """A subset of `fields`, each drawn by `field`, plus maybe an unknown key (line breaks included)."""
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    out = {name: draw(field(*fields[name])) for name in chosen}
    if draw(st.integers(0, 15)) == 0:
        keys = st.sampled_from(["unknown", "Tags", "max-steps", *LINE_BREAKS]) | unicode_text
        out[draw(keys)] = draw(toml_values())
    return out


@st.composite
def toml_bytes(draw: st.DrawFn, doc: Mapping[str, Any]) -> bytes:
    """A rendered document, sometimes damaged: text-level edits, bad UTF-8, or noise."""
    text = toml_document(doc)
    mode = draw(st.integers(0, 11))
    if mode == 0:
        return draw(st.binary(max_size=256))
    if mode == 1:
        text += draw(
            st.sampled_from(["[x", "a = ", "= 1", "a = 1\na = 2", '"\\q" = 1', "a = 1979-05-27T25:00:00", "[[ ]]"])
            | unicode_text
        )
    data = text.encode("utf-8", "surrogatepass")
    return draw(damaged(data)) if mode == 2 else data


#: Prices as an operator may write them: TOML ints and floats, and decimal strings.
good_prices = st.one_of(
    st.integers(0, 1000),
    st.decimals(0, 1000, places=4).map(lambda d: RawToml(_toml_decimal(d))),
    st.decimals(0, 1000, places=4).map(str),
)


@cache
def bad_prices() -> st.SearchStrategy[Any]:
    exponents = (10, 20, 40, 46, 47, 100, 999_999, 1_000_000)
    return st.one_of(
        st.sampled_from(["-1", "NaN", "Infinity", "-0", "1e6", "1e-30", " 3.00 ", "3,00", "0x10", "1_000", ""]),
        st.sampled_from([f"9e{n}" for n in exponents]),
        st.integers(-(2**63), 2**63 - 1),
        st.booleans(),
    )


small_tag_strings = st.one_of(valid_tags, near_valid(valid_tags), any_text, nasty_text)


@st.composite
def profile_configs(draw: st.DrawFn) -> bytes:
    """`config.toml` of a profile: the documented keys with good and bad values, or damage."""
    tools = st.lists(st.sampled_from(BUILTIN_TOOLS), max_size=4)
    policies = st.sampled_from(["auto", "ask", "deny"])
    approval: dict[str, Field] = {
        "timeout_s": (st.floats(0.001, 1e6) | st.integers(1, 10**6), st.floats() | st.integers(-10, 0)),
        "tools": (
            st.dictionaries(st.sampled_from(BUILTIN_TOOLS), policies, max_size=3),
            st.dictionaries(unicode_text, st.sampled_from(["ASK", ""]) | policies, max_size=3),
        ),
    }
    prompt_file = st.sampled_from(["missing.md", ".", "sub", "prompt.md/x", "", "../x", "prompt\x00.md", "\x00"])
    doc: dict[str, Any] = draw(
        optional_fields(
            {
                "tags": (st.lists(valid_tags, max_size=3, unique=True), st.lists(small_tag_strings, max_size=3)),
                "provider": (st.sampled_from(PROVIDERS), unicode_text),
                "model": (st.sampled_from(["scripted", "claude-sonnet-4-5"]), st.just("") | unicode_text),
                "system_prompt": (unicode_text, huge_text()),
                "system_prompt_file": (st.just("prompt.md"), prompt_file),
                "tools": (tools, st.lists(unicode_text, min_size=1, max_size=2)),
                "max_steps": (st.integers(1, 50), edge_ints.filter(lambda n: -(2**63) <= n < 2**63)),
                "max_delegation_depth": (st.integers(0, 3), st.integers(-(2**63), -1)),
                "workspace": (st.sampled_from(["workspace", "/tmp/x", "~/w", "~"]), unicode_text),
                "provider_options": (st.dictionaries(unicode_text, toml_values(), max_size=3), toml_values()),
            }
        )
    )
    if draw(st.booleans()):
        doc["approval"] = Table(draw(optional_fields(approval)))
    return draw(toml_bytes(doc))


@st.composite
def price_files(draw: st.DrawFn) -> bytes:
    """An operator price file: `[[price]]` entries with good and bad keys and values, or damage."""
    effective_good = st.one_of(
        st.dates(), st.datetimes(timezones=st.none() | st.just(UTC)), st.just("2026-01-01T00:00:00+05:00")
    )
    effective_bad = st.one_of(
        st.times(),
        st.sampled_from(["yesterday", "2026-13-01", "", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"]),
    )
    providers = st.sampled_from(["anthropic", "openai", "claude-code", "codex", "scripted", "google"])
    models = st.sampled_from(["claude-sonnet-4-5", "gpt-5", "claude-*", "*", "gpt-?", "[ab]*", "My-Model"])
    entry: dict[str, Field] = {
        "provider": (providers, st.sampled_from([" ", ""]) | unicode_text),
        "model": (models, st.sampled_from(["", " ", "["]) | unicode_text),
        "effective_from": (effective_good, effective_bad),
        "input_mtok": (good_prices, bad_prices()),
        "output_mtok": (good_prices, bad_prices()),
        "cache_read_mtok": (good_prices, bad_prices()),
        "cache_write_5m_mtok": (good_prices, bad_prices()),
        "cache_write_1h_mtok": (good_prices, bad_prices()),
    }
    required = st.fixed_dictionaries({"model": models, "input_mtok": good_prices, "output_mtok": good_prices})
    entries = [
        {**base, **extra} for base, extra in draw(st.lists(st.tuples(required, optional_fields(entry)), max_size=4))
    ]
    doc: dict[str, Any] = {}
    empty_array = draw(st.booleans())
    if entries or empty_array:
        doc["price"] = TableArray(entries)
    if draw(st.integers(0, 15)) == 0:
        doc = {"price": draw(toml_values())}
    if draw(st.integers(0, 15)) == 0:
        doc[draw(unicode_text)] = draw(toml_values())
    return draw(toml_bytes(doc))


@st.composite
def billing_configs(draw: st.DrawFn) -> bytes:
    """A billing config: `[[budget]]` entries and a `[metrics]` table, good and bad."""
    budget: dict[str, Field] = {
        "period": (st.sampled_from(["month", "day"]), st.sampled_from(["week", "Month", ""]) | toml_values()),
        "name": (st.from_regex(r"[a-z0-9/:_-]{1,20}", fullmatch=True), st.sampled_from(["a b", "", " "]) | texts()),
    }
    required = st.fixed_dictionaries(
        {
            "tag": valid_tags | small_tag_strings,
            "limit_usd": good_prices.filter(lambda p: p not in (0, "0")) | bad_prices(),
        }
    )
    limits = st.integers(1, 10_000)
    metrics: dict[str, Field] = {
        "tag_label_keys": (
            st.lists(st.from_regex(r"[a-z0-9_-]{1,8}", fullmatch=True), max_size=3),
            st.lists(st.sampled_from(["Client", "a:b", ""]) | unicode_text, min_size=1, max_size=3),
        ),
        "max_tag_values": (limits, edge_ints.filter(lambda n: -(2**63) <= n < 2**63)),
        "max_models": (limits, st.integers(-1, 0) | st.integers(10_001, 20_000)),
        "max_providers": (limits, st.booleans() | st.floats()),
    }
    extras = optional_fields(budget)
    budgets = [{**base, **extra} for base, extra in draw(st.lists(st.tuples(required, extras), max_size=4))]
    doc: dict[str, Any] = {"budget": TableArray(budgets)}
    if draw(st.booleans()):
        doc["metrics"] = Table(draw(optional_fields(metrics)))
    if draw(st.integers(0, 15)) == 0:
        doc[draw(st.sampled_from(["budget", "metrics", "other"]))] = draw(toml_values())
    return draw(toml_bytes(doc))


# --- transcripts -----------------------------------------------------------------------------------------

#: Timestamps as vendors write them, and as they should not.
_AWARE_STAMPS: Final = (
    "2026-01-01T10:00:00Z",
    "2026-01-01T10:00:01.123Z",
    "2026-01-01T10:00:00+05:00",
    "2026-01-01T10:00:02.5-08:00",
    "0001-01-01T00:00:00+05:00",
    "9999-12-31T23:59:59-05:00",
)
_BAD_STAMPS: Final = ("", "yesterday", "2026-13-01T00:00:00Z", "2026-01-01T10:00:00ZZ", "T")
_NAIVE_STAMPS: Final = ("2026-01-01T10:00:00", "2026-01-01", "2026-01-01 10:00:00", "2026-W01", "20260101")
_junk = json_values(max_leaves=4)


@st.composite
def _maybe(draw: st.DrawFn, good: st.SearchStrategy[JSON], junk: st.SearchStrategy[JSON]) -> JSON:
    return draw(junk) if draw(st.integers(0, 7)) == 0 else draw(good)


def maybe(good: st.SearchStrategy[JSON], junk: st.SearchStrategy[JSON] = _junk) -> st.SearchStrategy[JSON]:
    """Usually `good`; one time in eight a value of another JSON type (`junk`)."""
    return _maybe(good, junk)


timestamps = maybe(
    st.sampled_from(_AWARE_STAMPS + _BAD_STAMPS + _NAIVE_STAMPS)
    | st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat().replace("+00:00", "Z"))
)


def objects(
    required: Mapping[str, st.SearchStrategy[JSON]], optional: Mapping[str, st.SearchStrategy[JSON]]
) -> st.SearchStrategy[dict[str, JSON]]:
    """A JSON object with the `required` keys and any subset of the `optional` ones."""
    return st.fixed_dictionaries(dict(required), optional=dict(optional))


def _ids(prefix: str, n: int) -> st.SearchStrategy[str]:
    """A small pool of ids, so records refer to each other (replies to prompts, results to calls)."""
    return st.sampled_from([f"{prefix}{i}" for i in range(n)])


CLAUDE_TOOLS: Final = ("Read", "Edit", "Write", "MultiEdit", "NotebookEdit", "Bash", "Grep", "Task", "Agent", "mcp__x")
_counts = maybe(st.integers(0, 10**6) | st.sampled_from([-1, 2**63, 1.5, "7", True]))
_short_text = maybe(unicode_text)
_tool_ids = maybe(_ids("toolu_", 4), _junk)
_line_uuids = maybe(_ids("u", 6), _junk)
_agent_ids = maybe(_ids("agent", 2))

_claude_tool_input = objects(
    {},
    {
        "file_path": st.sampled_from(["/src/a.py", "b.txt", ""]),
        "notebook_path": st.just("/n.ipynb"),
        "offset": _counts,
        "limit": _counts,
        "prompt": st.sampled_from(["do it", "Warmup"]),
        "description": _short_text,
        "command": st.sampled_from(["git commit -m x", "ls"]) | st.lists(unicode_text, max_size=2),
    },
)
_claude_block = objects(
    {"type": maybe(st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image"]) | unicode_text)},
    {
        "text": maybe(texts()),
        "id": _tool_ids,
        "name": maybe(st.sampled_from(CLAUDE_TOOLS), _junk),
        "input": maybe(_claude_tool_input),
        "tool_use_id": _tool_ids,
        "content": maybe(
            texts(huge=False) | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": unicode_text}))
        ),
        "is_error": maybe(st.booleans()),
    },
)
_claude_usage = objects(
    {},
    {
        "input_tokens": _counts,
        "output_tokens": _counts,
        "cache_read_input_tokens": _counts,
        "cache_creation_input_tokens": _counts,
        "cache_creation": maybe(st.fixed_dictionaries({"ephemeral_1h_input_tokens": _counts})),
        "service_tier": st.sampled_from(["standard", "priority"]),
        "speed": maybe(st.sampled_from(["standard", "fast", "warp"])),
    },
)
_claude_message = objects(
    {},
    {
        "id": maybe(_ids("msg_", 3)),
        "role": st.sampled_from(["user", "assistant"]),
        "model": maybe(st.sampled_from(["claude-sonnet-4-5", "<synthetic>"]) | unicode_text),
        "content": maybe(texts() | st.lists(_claude_block, max_size=3)),
        "usage": maybe(_claude_usage),
        "stop_reason": _short_text,
    },
)
_hunk_number = maybe(st.integers(-5, 100))
_claude_tool_result = objects(
    {},
    {
        "interrupted": maybe(st.booleans()),
        "agentId": _agent_ids,
        "usage": maybe(_claude_usage),
        "file": maybe(st.fixed_dictionaries({"startLine": _counts, "numLines": _counts})),
        "structuredPatch": maybe(
            st.lists(
                objects(
                    {},
                    {
                        "oldStart": _hunk_number,
                        "oldLines": _hunk_number,
                        "newStart": _hunk_number,
                        "newLines": _hunk_number,
                        "lines": maybe(st.lists(unicode_text, max_size=3)),
                    },
                ),
                max_size=2,
            )
        ),
        "originalFile": texts(),
    },
)
_claude_embedded = _claude_message | st.fixed_dictionaries({"type": st.just("assistant"), "message": _claude_message})
_claude_common: dict[str, st.SearchStrategy[JSON]] = {
    "uuid": _line_uuids,
    "parentUuid": maybe(_ids("u", 6)),
    "sessionId": maybe(_ids("s", 2)),
    "timestamp": timestamps,
    "cwd": maybe(st.sampled_from(["/repo", "C:\\repo", ""])),
    "gitBranch": maybe(st.sampled_from(["main", ""])),
    "isSidechain": maybe(st.booleans()),
    "agentId": _agent_ids,
}


def _claude_kind(kind: str, fields: Mapping[str, st.SearchStrategy[JSON]]) -> st.SearchStrategy[JSON]:
    """One kind of transcript line: the fields every line may carry and the ones of its kind."""
    return objects({"type": maybe(st.just(kind), _junk)}, {**_claude_common, **fields})


#: One Claude Code transcript line (a JSON object) of each kind the reader looks at, or another kind.
claude_records = st.one_of(
    _claude_kind(
        "user",
        {
            "message": maybe(_claude_message),
            "toolUseResult": maybe(_claude_tool_result),
            "isMeta": maybe(st.booleans()),
            "isCompactSummary": maybe(st.booleans()),
        },
    ),
    _claude_kind("assistant", {"message": maybe(_claude_message), "requestId": maybe(_ids("req_", 3), _junk)}),
    _claude_kind("summary", {"summary": _short_text, "leafUuid": maybe(_ids("u", 6))}),
    _claude_kind(
        "progress",
        {
            "parentToolUseID": _tool_ids,
            "data": maybe(
                st.fixed_dictionaries(
                    {"type": st.just("agent_progress"), "agentId": _agent_ids, "message": maybe(_claude_embedded)}
                )
            ),
        },
    ),
    objects({"type": unicode_text}, {"version": _short_text, "message": _junk}),
)


@st.composite
def transcript_lines(
    draw: st.DrawFn, coherent: st.SearchStrategy[list[JSON]], extra: st.SearchStrategy[JSON]
) -> list[JSON]:
    """A coherent transcript with stray records inserted and a few records structurally mutated."""
    records = list(draw(coherent))
    for _ in range(draw(st.integers(0, 3))):
        records.insert(draw(st.integers(0, len(records))), draw(extra))
    for _ in range(draw(st.integers(0, 2))):
        if records:
            at = draw(st.integers(0, len(records) - 1))
            if isinstance(records[at], dict):
                records[at] = draw(mutated(records[at]))
    return records


@st.composite
def jsonl(draw: st.DrawFn, records: st.SearchStrategy[list[JSON]]) -> bytes:
    """A transcript file: JSON lines, some of them broken, blank, non-objects, deep or not UTF-8."""
    lines: list[bytes] = []
    for record in draw(records):
        line = dump_json(record, ensure_ascii=draw(st.booleans()))
        bad = draw(st.integers(0, 15))
        if bad == 0:
            line = draw(damaged(line))
        elif bad == 1:
            line = dump_json(draw(json_values() | deep_values))
        elif bad == 2:
            line = b""
        lines.append(line)
    ending = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    return ending.join(lines) + draw(st.sampled_from([b"", ending]))


_aware_stamps = st.sampled_from(_AWARE_STAMPS[:4]) | st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.isoformat().replace("+00:00", "Z"))
_small_counts = st.integers(0, 5000)


def _claude_usage_of(draw: st.DrawFn) -> dict[str, JSON]:
    return {
        "input_tokens": draw(_small_counts),
        "output_tokens": draw(_small_counts),
        "cache_read_input_tokens": draw(_small_counts),
        "cache_creation_input_tokens": draw(_small_counts),
        "cache_creation": {"ephemeral_1h_input_tokens": draw(_small_counts)},
        "service_tier": "standard",
    }


@st.composite
def claude_conversation(draw: st.DrawFn, agent: str | None = None) -> list[JSON]:
    """A coherent Claude Code transcript: prompts, replies split over lines, tool calls and results.

    With `agent`, a subagent's transcript (sidechain lines with its agent id, opened by the prompt
    the main session's Task call gives it).
    """
    owner = agent or "main"
    records: list[JSON] = []
    parent: str | None = None

    def line(kind: str, **fields: JSON) -> None:
        nonlocal parent
        uid = f"{owner}-u{len(records)}"
        record: dict[str, JSON] = {
            "type": kind,
            "uuid": uid,
            "parentUuid": parent,
            "sessionId": "s0",
            "timestamp": draw(_aware_stamps),
            "cwd": "/repo",
            "gitBranch": "main",
            "version": "2.0.0",
            **fields,
        }
        if agent:
            record |= {"isSidechain": True, "agentId": agent}
        parent = uid
        records.append(record)

    prompts = (
        st.sampled_from(
            [
                "fix the bug",
                "<command-name>/clear</command-name>",
                "[Request interrupted by user]",
                "Caveat: x",
                "<ide_selection>x",
            ]
        )
        | unicode_text
    )
    for turn in range(draw(st.integers(1, 3))):
        line("user", message={"role": "user", "content": "do it" if agent and turn == 0 else draw(prompts)})
        for step in range(draw(st.integers(0, 2))):
            msg_id, tool_id = f"msg_{owner}_{turn}_{step}", f"toolu_{owner}_{turn}_{step}"
            tool = draw(st.sampled_from(CLAUDE_TOOLS))
            tool_input = {
                "file_path": "/src/a.py",
                "offset": draw(_small_counts),
                "limit": draw(_small_counts),
                "command": draw(st.sampled_from(["git commit -m x", "ls"])),
                "prompt": "do it",
                "description": "Explore the code",
            }
            reply = {"id": msg_id, "role": "assistant", "model": "claude-sonnet-4-5", "usage": _claude_usage_of(draw)}
            line("assistant", requestId=f"req_{msg_id}", message={**reply, "content": [{"type": "text", "text": "ok"}]})
            tool_use = {"type": "tool_use", "id": tool_id, "name": tool, "input": tool_input}
            line("assistant", requestId=f"req_{msg_id}", message={**reply, "content": [tool_use]})
            if tool in ("Task", "Agent") and not agent and draw(st.booleans()):
                embedded = {"type": "assistant", "message": {**reply, "id": f"{msg_id}_sub", "content": "sub"}}
                data = {"type": "agent_progress", "agentId": "a1", "message": embedded}
                line("progress", parentToolUseID=tool_id, data=data)
            result = {
                "type": "tool_result",
                "tool_use_id": tool_id,
                "content": draw(st.sampled_from(["ok", "The user doesn't want to proceed with this tool use"])),
                "is_error": draw(st.booleans()),
            }
            structured = {
                "file": {"startLine": draw(_small_counts), "numLines": draw(_small_counts)},
                "structuredPatch": [
                    {"oldStart": 1, "oldLines": 2, "newStart": 1, "newLines": 3, "lines": ["-a", "+b"]}
                ],
                "agentId": "a0",
                "usage": _claude_usage_of(draw),
                "interrupted": draw(st.booleans()),
                "originalFile": "x = 1\n",
            }
            line("user", toolUseResult=structured, message={"role": "user", "content": [result]})
        reply = {"id": f"msg_{owner}_{turn}_end", "role": "assistant", "model": "claude-sonnet-4-5"}
        line(
            "assistant",
            message={**reply, "usage": _claude_usage_of(draw), "content": [{"type": "text", "text": "done"}]},
        )
    if not agent and draw(st.booleans()):
        line("summary", summary="A title", leafUuid=parent)
    return records


@dataclass(frozen=True)
class ClaudeTree:
    """A Claude Code project folder: the session file, subagent files, and which file to read."""

    session: bytes
    agents: dict[str, bytes]
    nested: bool
    read_agent: str | None


@st.composite
def claude_trees(draw: st.DrawFn) -> ClaudeTree:
    agents: dict[str, bytes] = {}
    for agent in draw(st.lists(st.sampled_from(["a0", "a1", "a2"]), unique=True, max_size=2)):
        agents[f"agent-{agent}"] = draw(jsonl(transcript_lines(claude_conversation(agent), claude_records)))
    read_agent = draw(st.none() | st.sampled_from(sorted(agents))) if agents else None
    session = draw(jsonl(transcript_lines(claude_conversation(), claude_records)))
    return ClaudeTree(session, agents, draw(st.booleans()), read_agent)


CODEX_TOOLS: Final = ("shell", "exec_command", "apply_patch", "read_file", "list_dir", "update_plan", "container.exec")
PATCHES: Final = (
    "*** Begin Patch\n*** Update File: a.py\n@@\n-old\n+new\n context\n*** End Patch",
    "*** Begin Patch\n*** Add File: b.py\n+x\n*** Move to: c.py\n*** Delete File: d\n*** End Patch",
    "*** Update File: \n+",
    "",
)
_codex_usage = objects(
    {}, {"input_tokens": _counts, "cached_input_tokens": _counts, "output_tokens": _counts, "total_tokens": _counts}
)
_codex_arguments = st.one_of(
    st.sampled_from(PATCHES).map(lambda p: json.dumps({"command": ["apply_patch", p]})),
    st.sampled_from(['{"command": ["ls"]}', "{", "null", "[]", '"x"']),
    texts(huge=False),
)
_codex_output = st.one_of(
    st.builds(
        lambda text, code: json.dumps({"output": text, "metadata": {"exit_code": code}}),
        st.sampled_from(["ok", "aborted", "exec command rejected by user"]) | unicode_text,
        maybe(st.integers(-1, 2)),
    ),
    texts(huge=False),
)


def _codex_kind(
    kind: str, payload_type: str | None, fields: Mapping[str, st.SearchStrategy[JSON]]
) -> st.SearchStrategy[JSON]:
    """One kind of rollout line: its `payload.type`, if any, and the payload fields the reader uses."""
    required = {"type": maybe(st.just(payload_type), _junk)} if payload_type else {}
    payload = objects(required, {name: maybe(value) for name, value in fields.items()})
    return objects({"type": st.just(kind), "payload": maybe(payload)}, {"timestamp": timestamps})


_call_ids = _ids("call_", 3)
#: One Codex rollout line: session_meta, turn_context, event_msg or response_item of each shape, or junk.
codex_records = st.one_of(
    _codex_kind(
        "session_meta",
        None,
        {
            "id": st.sampled_from(["0199a6f0-0000-7000-8000-000000000001", ""]) | unicode_text,
            "cwd": st.sampled_from(["/repo", "C:\\repo\\", "/", ""]),
            "git": st.fixed_dictionaries({}, optional={"branch": maybe(st.just("main"))}),
            "timestamp": timestamps,
            "originator": unicode_text,
            "cli_version": unicode_text,
        },
    ),
    _codex_kind("turn_context", None, {"model": st.sampled_from(["gpt-5", ""]) | unicode_text, "cwd": unicode_text}),
    _codex_kind("event_msg", "user_message", {"message": texts()}),
    _codex_kind("event_msg", "turn_aborted", {}),
    _codex_kind(
        "event_msg",
        "token_count",
        {"info": objects({}, {"total_token_usage": maybe(_codex_usage), "last_token_usage": maybe(_codex_usage)})},
    ),
    _codex_kind(
        "response_item",
        "message",
        {
            "role": st.sampled_from(["user", "assistant", "developer"]),
            "content": st.lists(objects({"type": st.just("output_text")}, {"text": maybe(texts())}), max_size=2),
        },
    ),
    _codex_kind(
        "response_item",
        "function_call",
        {"name": st.sampled_from(CODEX_TOOLS) | unicode_text, "call_id": _call_ids, "arguments": _codex_arguments},
    ),
    _codex_kind(
        "response_item",
        "custom_tool_call",
        {"name": st.just("apply_patch"), "call_id": _call_ids, "input": st.sampled_from(PATCHES)},
    ),
    _codex_kind(
        "response_item",
        "local_shell_call",
        {
            "call_id": _call_ids,
            "action": st.fixed_dictionaries(
                {"command": maybe(st.sampled_from([["apply_patch", PATCHES[0]], ["ls"], []]))}
            ),
        },
    ),
    _codex_kind("response_item", "function_call_output", {"call_id": _call_ids, "output": _codex_output}),
    _codex_kind("response_item", "custom_tool_call_output", {"call_id": _call_ids, "output": _codex_output}),
    objects({"type": unicode_text}, {"payload": _junk, "timestamp": timestamps}),
)


@st.composite
def codex_rollout(draw: st.DrawFn) -> list[JSON]:
    """A coherent Codex rollout: its meta and context, prompts, token counts, tool calls and outputs."""

    def at() -> str:
        return str(draw(_aware_stamps))

    def item(kind: str, **payload: JSON) -> dict[str, JSON]:
        return {"type": kind, "timestamp": at(), "payload": payload}

    meta = {"id": "0199a6f0-0000-7000-8000-000000000001", "cwd": "/repo", "git": {"branch": "main"}}
    records: list[JSON] = [
        item("session_meta", **meta, timestamp=at(), originator="codex_cli_rs", cli_version="0.46.0"),
        item("turn_context", model="gpt-5", cwd="/repo", approval_policy="on-request", effort="high"),
    ]
    for turn in range(draw(st.integers(1, 3))):
        prompt = draw(st.sampled_from(["fix it", "/review", "## My request for Codex:\nfix"]) | unicode_text)
        records.append(item("event_msg", type="user_message", message=prompt))
        records.append(
            item("response_item", type="message", role="user", content=[{"type": "input_text", "text": prompt}])
        )
        for step in range(draw(st.integers(0, 2))):
            usage = {
                "input_tokens": draw(_small_counts),
                "cached_input_tokens": draw(_small_counts),
                "output_tokens": draw(_small_counts),
                "reasoning_output_tokens": draw(_small_counts),
            }
            count = item("event_msg", type="token_count", info={"total_token_usage": usage, "last_token_usage": usage})
            records += [count, count] if draw(st.booleans()) else [count]
            call_id = f"call_{turn}_{step}"
            shape = draw(st.sampled_from(["shell", "apply_patch", "custom", "local"]))
            patch = draw(st.sampled_from(PATCHES))
            if shape == "shell":
                arguments = json.dumps({"command": draw(st.sampled_from([["ls"], ["git", "commit", "-m", "x"]]))})
                records.append(
                    item("response_item", type="function_call", name="shell", call_id=call_id, arguments=arguments)
                )
            elif shape == "apply_patch":
                arguments = json.dumps({"command": ["apply_patch", patch]})
                records.append(
                    item("response_item", type="function_call", name="shell", call_id=call_id, arguments=arguments)
                )
            elif shape == "custom":
                records.append(
                    item("response_item", type="custom_tool_call", name="apply_patch", call_id=call_id, input=patch)
                )
            else:
                action = {"command": ["apply_patch", patch]}
                records.append(item("response_item", type="local_shell_call", call_id=call_id, action=action))
            code = draw(st.sampled_from([0, 0, 1]))
            output = json.dumps({"output": draw(st.sampled_from(["ok", "aborted"])), "metadata": {"exit_code": code}})
            kind = "custom_tool_call_output" if shape == "custom" else "function_call_output"
            records.append(item("response_item", type=kind, call_id=call_id, output=output))
        answer = [{"type": "output_text", "text": draw(unicode_text)}]
        records.append(item("response_item", type="message", role="assistant", content=answer))
        if draw(st.integers(0, 5)) == 0:
            records.append(item("event_msg", type="turn_aborted"))
    return records


rollouts = jsonl(transcript_lines(codex_rollout(), codex_records))


# --- CLI arguments ---------------------------------------------------------------------------------------


@cache
def _argv_token() -> st.SearchStrategy[str]:
    # Undecodable bytes reach sys.argv as surrogate escapes.
    chars = st.characters(codec="utf-8") | st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)
    spans = st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**20), st.sampled_from("dhm"))
    return st.one_of(
        st.text(chars, max_size=20),
        st.sampled_from(["-", "--", "--=", "-x", "--format", "--since", "--limit", "--all", "--help"]),
        st.sampled_from(["7d", "2026-11-01", "2026-11-01T10:00:00+05:00", "0001-01-01", "nan", "-1", "1e9"]),
        spans,
        st.uuids().map(str),
        valid_tags,
    )


@dataclass(frozen=True)
class Command:
    """One sub-command of a parser, as far as building its command lines goes."""

    path: tuple[str, ...]
    flags: tuple[str, ...]  # options that take no value
    options: tuple[tuple[str, tuple[str, ...]], ...]  # options with a value, and its choices if any
    positionals: int


def commands(parser: Any) -> list[Command]:
    """Every sub-command path of an argparse parser with the arguments it takes."""
    import argparse

    out: list[Command] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        flags: list[str] = []
        options: list[tuple[str, tuple[str, ...]]] = []
        positionals = 0
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))
            elif isinstance(action, argparse._HelpAction):
                continue
            elif not action.option_strings:
                positionals += 1
            elif action.nargs == 0:
                flags += action.option_strings
            else:
                choices = tuple(str(c) for c in action.choices or ())
                options += [(o, choices) for o in action.option_strings]
        out.append(Command(path, tuple(flags), tuple(options), positionals))

    walk(parser, ())
    return out


@st.composite
def argv_lists(draw: st.DrawFn, known: Sequence[Command]) -> list[str]:
    """A command line: a real sub-command path, its arguments with good and fuzzed values, stray tokens."""
    command = draw(st.sampled_from(list(known)))
    argv = list(command.path)
    if argv and draw(st.integers(0, 7)) == 0:
        argv[draw(st.integers(0, len(argv) - 1))] = draw(_argv_token())
    for _ in range(draw(st.integers(0, command.positionals))):
        argv.append(draw(_argv_token()))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        if kind < 4 and command.options:
            option, choices = draw(st.sampled_from(command.options))
            value = st.sampled_from(choices) if choices and kind < 3 else _argv_token()
            argv += [option, draw(value)] if draw(st.integers(0, 7)) else [option]
        elif kind < 7 and command.flags:
            argv.append(draw(st.sampled_from(command.flags)))
        else:
            argv.append(draw(_argv_token()))
    return argv


# --- environment -----------------------------------------------------------------------------------------

#: Characters `os.environ` can hold: anything but NUL, with undecodable bytes as surrogate escapes.
env_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00") | st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
    max_size=30,
)
URL_VARS: Final = ("COS_NATS_URL", "COS_DATABASE_URL")
NUMBER_VARS: Final = (
    "COS_STREAM_REPLICAS",
    "COS_HTTP_PORT",
    "COS_BATCH_SIZE",
    "COS_BATCH_TIMEOUT_S",
    "COS_DRAIN_TIMEOUT_S",
    "COS_PARTITIONS",
    "COS_PARTITION",
)
PATH_VARS: Final = (
    "COS_NATS_CREDS",
    "COS_NATS_TLS_CA",
    "COS_NATS_TLS_CERT",
    "COS_NATS_TLS_KEY",
    "COS_DATA_DIR",
    "COS_PROFILES_DIR",
    "COS_PRICE_FILE",
    "COS_BILLING_CONFIG",
)


GOOD_URLS: Final = {
    "COS_NATS_URL": ("nats://127.0.0.1:4222", "tls://h:1,nats://g:2", "nats://[::1]:4222", "ws://h"),
    "COS_DATABASE_URL": ("postgresql://u:p@h:5432/db", "postgres://h/db"),
}


@cache
def _url_values() -> st.SearchStrategy[str]:
    """Bad URLs: a bad scheme or port, an unbalanced IPv6 bracket, junk."""
    edges = st.sampled_from(
        ["nats://h:99999", "nats://h:x", "http://h:1", "nats://", "nats:// h", ",", "nats://[::1", "postgresql://]h"]
    )
    return edges | env_text


@cache
def _path_values() -> st.SearchStrategy[str]:
    return st.sampled_from(["", "~/x", ".cos", "/nonexistent/x", "~no-such-user/x", "~"]) | env_text


@st.composite
def environments(draw: st.DrawFn, secret_files: Sequence[str]) -> dict[str, str]:
    """A `COS_*` environment: each variable unset, plausible, at an edge, or junk."""
    plausible = {
        "COS_BATCH_TIMEOUT_S": st.sampled_from(["", "0.5", "3"]),
        "COS_DRAIN_TIMEOUT_S": st.sampled_from(["", "0.5", "30"]),
        "COS_PARTITION": st.sampled_from(["", "0"]),
        "COS_STREAM_REPLICAS": st.sampled_from(["", "1", "3"]),
    }
    edges = st.sampled_from(["0", "-1", "65536", "1e3", "0x10", " 5 ", "1_0", "nan", "inf", "٣", "9" * 5000])
    env: dict[str, str] = {}

    def sometimes(name: str, good: st.SearchStrategy[str], bad: st.SearchStrategy[str]) -> None:
        pick = draw(st.integers(0, 11))
        if pick >= 6:
            return
        env[name] = draw(bad if pick == 0 else good)

    for name in URL_VARS:
        sometimes(name, st.sampled_from(GOOD_URLS[name]), _url_values())
    for name in NUMBER_VARS:
        sometimes(name, plausible.get(name, st.sampled_from(["", "1", "2", "100"])), edges | env_text)
    for name in PATH_VARS:
        sometimes(name, st.sampled_from(["~/x", ".cos", "/nonexistent/x", "rel/path"]), _path_values())
    sometimes("COS_LOG_LEVEL", st.sampled_from(["debug", "INFO", "warning", "Error"]), st.just("ınfo") | env_text)
    sometimes("COS_NATS_PASSWORD", env_text, env_text)
    sometimes("COS_NATS_PASSWORD_FILE", st.sampled_from(list(secret_files)), st.sampled_from(list(secret_files)))
    for name in ("COS_NATS_USER", "COS_HTTP_HOST", "COS_UNKNOWN", "OTHER"):
        sometimes(name, env_text, env_text)
    return env


# --- graphs ----------------------------------------------------------------------------------------------


@st.composite
def valid_graphs(draw: st.DrawFn) -> dict[str, JSON]:
    """A small graph that passes `validate`: one session, input, reply, tool call and its result."""
    ids = [str(u) for u in draw(st.lists(st.uuids(), min_size=8, max_size=8, unique=True))]
    sid, uid, mid, aid, tid, rid, fid, kid = ids
    status = draw(st.sampled_from([g.ToolStatus.OK, g.ToolStatus.ERROR, g.ToolStatus.INTERRUPTED]))
    counts = st.integers(0, 10**9)
    when = st.none() | aware_datetimes
    output_tokens = draw(counts)
    graph = g.Graph(
        sessions=[
            g.Session(
                id=sid,
                parent_session_id=None,
                spawned_by_tool_use_id=None,
                outcome=draw(st.sampled_from(g.Outcome)),
                title=draw(st.none() | _text),
                started_at=draw(when),
            )
        ],
        user_inputs=[
            g.UserInput(
                id=uid,
                session_id=sid,
                ordinal=0,
                text=draw(_text),
                interrupted=draw(st.booleans()),
                kind=draw(st.sampled_from(g.InputKind)),
                origin=draw(st.sampled_from(g.InputOrigin)),
                metadata=msgspec.Raw(b"{}"),
                triggered_at=draw(when),
            )
        ],
        model_invocations=[
            g.ModelInvocation(
                id=mid,
                session_id=sid,
                user_input_id=uid,
                parent_model_invocation_id=None,
                input_tokens=draw(counts),
                output_tokens=output_tokens,
                reasoning_tokens=draw(st.none() | st.integers(0, output_tokens)),
                cache_read_tokens=draw(counts),
                cache_write_tokens=0,
                total_tokens=draw(counts),
                token_basis=draw(st.none() | st.sampled_from(g.TokenBasis)),
                speed=draw(st.none() | st.just(g.SPEED_FAST)),
            )
        ],
        assistant_messages=[
            g.AssistantMessage(id=aid, session_id=sid, user_input_id=uid, model_invocation_id=mid, text=draw(_text))
        ],
        tool_uses=[
            g.ToolUse(
                id=tid,
                session_id=sid,
                user_input_id=uid,
                model_invocation_id=mid,
                name="Read",
                verb=g.ToolVerb.READ,
                input=msgspec.Raw(b'{"file_path": "a.py"}'),
                status=status,
                metadata=msgspec.Raw(b"{}"),
            )
        ],
        tool_results=[
            g.ToolResult(
                id=rid,
                tool_use_id=tid,
                session_id=sid,
                user_input_id=uid,
                status=status,
                output_text=draw(st.none() | _text),
                output=draw(st.none() | st.just(msgspec.Raw(b'{"ok": true}'))),
            )
        ],
        file_touches=[
            g.FileTouch(
                id=fid,
                tool_use_id=tid,
                user_input_id=uid,
                session_id=sid,
                path="a.py",
                kind=g.TouchKind.READ,
                start_line=1,
                end_line=draw(st.integers(1, 100)),
            )
        ],
        token_usage=[
            g.TokenUsage(
                id=kid, session_id=sid, user_input_id=None, scope=g.UsageScope.SESSION, input_tokens=draw(counts)
            )
        ],
        vendor_ids=[
            g.VendorID(
                our_id=sid,
                our_type=g.EntityType.SESSION,
                session_id=sid,
                vendor="claude-code",
                vendor_id_kind="session_id",
                vendor_id=draw(unicode_text.filter(bool)),
            )
        ],
    )
    g.validate(graph)
    doc: dict[str, JSON] = json.loads(g.encode_graph(graph))
    return doc


#: Graph JSON: valid, mutated and damaged, or noise.
graph_payloads = st.one_of(
    valid_graphs().map(dump_json),
    valid_graphs().flatmap(mutated).map(dump_json).flatmap(damaged),
    json_values().map(dump_json),
    deep_values.map(dump_json),
    st.binary(max_size=256),
)

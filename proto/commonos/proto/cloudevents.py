"""CloudEvents 1.0 NATS protocol binding, binary content mode.

Context attributes travel as `ce-<name>` headers; the body is the event's JSON. Header values are
percent-encoded as the CloudEvents NATS binding (§3.1.3.2) says: space, `"`, `%` and every character
outside printable ASCII (U+0021–U+007E) become `%XX` of their UTF-8 bytes; a receiver decodes them.

Every message of ours (an event, an alert) carries `ce-specversion`, `ce-id`, `ce-source`, `ce-type`,
`ce-time`, `ce-subject`, `ce-datacontenttype` (`application/json`), `ce-dataschema` (the `$id` of its
type's JSON Schema, `commonos.proto.schemas`), `content-type` (`application/json`, for readers that look
there) and `Nats-Msg-Id` = `ce-id`. Events stored before `ce-datacontenttype` and `ce-dataschema` were
added lack them, so a reader does not require them.

An event published inside an OpenTelemetry span (a producer with telemetry on: `commonos.runtime.telemetry`)
also carries the W3C Trace Context headers `traceparent` (`00-<trace id>-<span id>-<flags>`) and, when the
span has one, `tracestate`; they are optional, not CloudEvents attributes, and no check here reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Final
from urllib.parse import unquote

from commonos.proto.alerts import Alert, alert_type
from commonos.proto.errors import DataError
from commonos.proto.events import EventBase, event_type
from commonos.proto.schemas import alert_schema_id, event_schema_id

SPECVERSION: Final = "1.0"
CONTENT_TYPE: Final = "application/json"
MSG_ID: Final = "Nats-Msg-Id"
#: W3C Trace Context headers an event may carry (optional; written and read by `commonos.runtime.telemetry`).
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
DEFAULT_SOURCE: Final = "urn:commonos:unknown"
REQUIRED: Final = ("ce-specversion", "ce-id", "ce-source", "ce-type")
#: What every event of ours carries, and a consumer checks against the body.
EVENT_REQUIRED: Final = (*REQUIRED, "ce-subject", "ce-time")


class HeaderError(DataError):
    """Headers that are not a valid CloudEvents binary-mode envelope."""


#: Characters a header value may carry as they are: printable ASCII less `"` and `%`.
_NEEDS_ENCODING: Final = re.compile(r"[^\x21\x23\x24\x26-\x7e]")


def _must_encode(ch: str) -> bool:
    return _NEEDS_ENCODING.match(ch) is not None


def percent_encode(value: str) -> str:
    if _NEEDS_ENCODING.search(value) is None:
        return value
    out: list[str] = []
    for ch in value:
        if _must_encode(ch):
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
        else:
            out.append(ch)
    return "".join(out)


def percent_decode(value: str) -> str:
    return unquote(value, encoding="utf-8", errors="strict") if "%" in value else value


def ce_type(type_name: str, version: int = 1) -> str:
    return f"cos.{type_name}.v{version}"


def _rfc3339(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


def message_headers(
    *, id: str, type: str, source: str, time: datetime, subject: str, dataschema: str
) -> dict[str, str]:
    """The CloudEvents headers of any message of ours (an event, an alert): the attributes percent-encoded,
    `content-type` JSON too, and `Nats-Msg-Id` = the id, so that JetStream drops a republish. `time` is
    written as it is (RFC 3339, `Z` for UTC)."""
    raw = {
        "ce-specversion": SPECVERSION,
        "ce-id": id,
        "ce-source": source,
        "ce-type": type,
        "ce-time": _rfc3339(time),
        "ce-subject": subject,
        "ce-datacontenttype": CONTENT_TYPE,
        "ce-dataschema": dataschema,
    }
    headers = {k: percent_encode(v) for k, v in raw.items()}
    headers["content-type"] = CONTENT_TYPE
    headers[MSG_ID] = id
    return headers


def event_headers(event: EventBase, source: str = DEFAULT_SOURCE) -> dict[str, str]:
    """Headers for publishing `event`; `Nats-Msg-Id` = event id lets JetStream drop a republish."""
    type_name = event_type(event)
    return message_headers(
        id=str(event.event_id),
        type=ce_type(type_name),
        source=source,
        time=event.occurred_at,
        subject=str(event.session_id),
        dataschema=event_schema_id(type_name),
    )


def alert_headers(alert: Alert, source: str = DEFAULT_SOURCE) -> dict[str, str]:
    """Headers for publishing `alert`: as an event's, with `ce-subject` the budget's name."""
    type_name = alert_type(alert)
    return message_headers(
        id=str(alert.event_id),
        type=ce_type(type_name),
        source=source,
        time=alert.occurred_at,
        subject=alert.budget,
        dataschema=alert_schema_id(type_name),
    )


def decode_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """The CloudEvents attributes of a message (names without `ce-`), percent-decoded."""
    if not headers:
        raise HeaderError("no headers: not a CloudEvents binary-mode message")
    missing = [h for h in REQUIRED if h not in headers]
    if missing:
        raise HeaderError(f"missing CloudEvents headers: {', '.join(missing)}")
    attrs: dict[str, str] = {}
    for name, value in headers.items():
        if name.startswith("ce-"):
            try:
                attrs[name[3:]] = percent_decode(value)
            except UnicodeDecodeError as exc:
                raise HeaderError(f"header {name}: bad percent-encoding ({exc.reason})") from None
    if attrs["specversion"] != SPECVERSION:
        raise HeaderError(f"unsupported ce-specversion {attrs['specversion']!r}")
    return attrs


def _instant(value: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def check_event_headers(headers: Mapping[str, str] | None, event: EventBase) -> None:
    """Raise HeaderError unless `headers` are a CloudEvents 1.0 envelope of `event`: every attribute our
    producers send is there, decodes, and agrees with the body (`ce-time` as an instant).

    The common case (headers exactly as `event_headers` writes them) costs a few string comparisons.
    """
    if not headers or not any(name.startswith("ce-") for name in headers):
        raise HeaderError("no CloudEvents headers: not a CloudEvents binary-mode message")
    type_name = event_type(event)
    event_id, session = str(event.event_id), str(event.session_id)
    source = headers.get("ce-source")
    if (
        headers.get("ce-specversion") == SPECVERSION
        and headers.get("ce-id") == event_id
        and headers.get("ce-type") == ce_type(type_name)
        and headers.get("ce-subject") == session
        and headers.get("ce-time") == _rfc3339(event.occurred_at)
        and source
        and "%" not in source
    ):
        return
    missing = [h for h in EVENT_REQUIRED if h not in headers]
    if missing:
        raise HeaderError(f"missing CloudEvents headers: {', '.join(missing)}")
    attrs = decode_headers(dict(headers))
    if attrs["id"] != event_id:
        raise HeaderError(f"ce-id {attrs['id']!r} does not match the body's event_id")
    if attrs["type"] != ce_type(type_name):
        raise HeaderError(f"ce-type {attrs['type']!r} does not match the event type {type_name!r}")
    if attrs["subject"] != session:
        raise HeaderError(f"ce-subject {attrs['subject']!r} does not match the event's session {session}")
    moment = _instant(attrs["time"])
    if moment is None:
        raise HeaderError(f"ce-time {attrs['time']!r} is not an RFC 3339 time with an offset")
    if moment != event.occurred_at:
        raise HeaderError(f"ce-time {attrs['time']!r} does not match occurred_at {_rfc3339(event.occurred_at)}")
    if not attrs["source"]:
        raise HeaderError("ce-source is empty")

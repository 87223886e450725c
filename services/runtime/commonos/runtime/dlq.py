"""The dead-letter stream: events that cannot be projected, kept with their reason for a replay.

A dead letter is the original payload and headers on `cos.dlq.<profile>.<session>.<type>` (or
`cos.dlq.unrouted`), plus `Cos-Dlq-*` headers saying why, by whom and from where. Its
`Nats-Msg-Id` derives from the consumer and stream sequence, so a consumer that dead-letters the
same delivery twice (it crashed before acking) stores it once.

A dead letter is also a reference: `Cos-Dlq-Stream-Seq` names the original in `COS_EVENTS`. When the
original body with the `Cos-Dlq-*` headers would not fit the server's max_payload, the body is left
out (`Cos-Dlq-Body: omitted`, its size in `Cos-Dlq-Body-Bytes`) and, if need be, the original
headers too (`Cos-Dlq-Headers: omitted`); listing and replaying read the original from `COS_EVENTS`
by its sequence. A dead letter is therefore never larger than the server accepts.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.proto.cloudevents import MSG_ID, percent_decode
from commonos.proto.errors import DataError
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM, dlq_subject
from commonos.runtime.limits import EXPECTED_STREAM, check_fits, message_bytes, server_max_payload, with_stream_header
from commonos.runtime.nats import client_of

REASON: Final = "Cos-Dlq-Reason"
CONSUMER: Final = "Cos-Dlq-Consumer"
ORIGINAL_SUBJECT: Final = "Cos-Dlq-Subject"
STREAM_SEQ: Final = "Cos-Dlq-Stream-Seq"
DEAD_AT: Final = "Cos-Dlq-Time"
BODY: Final = "Cos-Dlq-Body"
BODY_BYTES: Final = "Cos-Dlq-Body-Bytes"
HEADERS: Final = "Cos-Dlq-Headers"
#: On a replayed event: the one consumer it is replayed for; every other consumer passes it by.
REPLAY_FOR: Final = "Cos-Replay-For"
OMITTED: Final = "omitted"
MAX_REASON_CHARS: Final = 2000


class DeadLetterError(DataError):
    """A dead letter that cannot be read back or replayed; the message says why."""


def _clean(value: str, limit: int = MAX_REASON_CHARS) -> str:
    """Header values are one line of printable ASCII: the reason is cut, then percent-encoded like the
    CloudEvents headers (nats-py would read a non-ASCII header value back as something else)."""
    flat = " ".join(value.split())
    cut = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    # Spaces and printable ASCII stay readable; `%` and everything else become %XX of their UTF-8 bytes.
    return "".join(ch if " " <= ch <= "~" and ch != "%" else "".join(f"%{b:02X}" for b in ch.encode()) for ch in cut)


def _read(value: str) -> str:
    try:
        return percent_decode(value)
    except UnicodeDecodeError:
        return value


@dataclass(frozen=True)
class DeadLetter:
    dlq_seq: int
    subject: str
    reason: str
    consumer: str
    stream_seq: int | None
    dead_at: str
    #: The original body: carried by the dead letter, or read back from COS_EVENTS when it was omitted.
    data: bytes
    headers: dict[str, str]
    #: The body was left out of the dead letter (too large to carry with the reason).
    body_omitted: bool = False
    #: The original's size in bytes, as the consumer received it.
    body_bytes: int = 0
    #: The body was omitted and the original is no longer in COS_EVENTS (retention, or deleted).
    original_missing: bool = False
    #: The original's headers, when they were left out of the dead letter and read back from COS_EVENTS.
    stored_headers: dict[str, str] | None = None

    def original_headers(self) -> dict[str, str]:
        if self.stored_headers is not None:
            return dict(self.stored_headers)
        return {k: v for k, v in self.headers.items() if not k.startswith("Cos-Dlq-")}


def dead_letter_headers(msg: Msg, reason: str, consumer: str, stream_seq: int) -> dict[str, str]:
    # The original headers are kept as they came (NATS headers are one line already), for a faithful replay.
    headers = dict(msg.headers or {})
    headers.update(_own_headers(msg, reason, consumer, stream_seq))
    return headers


def _own_headers(msg: Msg, reason: str, consumer: str, stream_seq: int) -> dict[str, str]:
    return {
        REASON: _clean(reason),
        CONSUMER: consumer,
        ORIGINAL_SUBJECT: _clean(msg.subject, 512),
        STREAM_SEQ: str(stream_seq),
        DEAD_AT: datetime.now(UTC).isoformat(),
        MSG_ID: f"dlq-{consumer}-{stream_seq}",
    }


def dead_letter_message(
    msg: Msg, reason: str, consumer: str, stream_seq: int, max_payload: int
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of the dead letter of `msg`, within `max_payload` (the JetStream header counted).

    Carries the original body and headers when they fit with the reason; else the body is omitted,
    and if that is not enough the original headers too: the stream sequence still names the original.
    """
    data = msg.data or b""
    headers = dead_letter_headers(msg, reason, consumer, stream_seq)
    if message_bytes(data, with_stream_header(headers, DLQ_STREAM)) <= max_payload:
        return data, headers
    headers[BODY] = OMITTED
    headers[BODY_BYTES] = str(len(data))
    if message_bytes(b"", with_stream_header(headers, DLQ_STREAM)) <= max_payload:
        return b"", headers
    headers = _own_headers(msg, reason, consumer, stream_seq)
    headers.update({BODY: OMITTED, BODY_BYTES: str(len(data)), HEADERS: OMITTED})
    check_fits(f"the dead letter of stream seq {stream_seq}", b"", with_stream_header(headers, DLQ_STREAM), max_payload)
    return b"", headers


async def dead_letter(
    js: JetStreamContext,
    msg: Msg,
    reason: str,
    consumer: str,
    stream_seq: int,
    timeout_s: float = 5.0,
    *,
    nc: Client | None = None,
) -> None:
    """Store `msg` in the dead-letter stream; raises if JetStream did not acknowledge it.

    `nc`, the connection `js` was made from, tells the server's max_payload (taken from `js` when not given).
    """
    limit = server_max_payload(nc if nc is not None else client_of(js))
    data, headers = dead_letter_message(msg, reason, consumer, stream_seq, limit)
    await js.publish(dlq_subject(msg.subject), data, timeout=timeout_s, stream=DLQ_STREAM, headers=headers)


async def list_dead_letters(js: JetStreamContext, limit: int | None = None) -> list[DeadLetter]:
    info = await js.stream_info(DLQ_STREAM)
    letters: list[DeadLetter] = []
    if info.state.messages == 0:
        return letters
    seq = info.state.first_seq
    while seq <= info.state.last_seq and (limit is None or len(letters) < limit):
        try:
            raw = await js.get_msg(DLQ_STREAM, seq)
        except nats.js.errors.NotFoundError:
            seq += 1
            continue
        headers = {str(k): str(v) for k, v in (raw.headers or {}).items()}
        letters.append(await _letter(js, raw.seq or seq, raw.subject or "", raw.data or b"", headers))
        seq += 1
    return letters


async def _letter(js: JetStreamContext, dlq_seq: int, subject: str, data: bytes, headers: dict[str, str]) -> DeadLetter:
    raw_seq = headers.get(STREAM_SEQ)
    stream_seq = int(raw_seq) if raw_seq and raw_seq.isdigit() else None
    omitted = headers.get(BODY) == OMITTED
    size = headers.get(BODY_BYTES, "")
    letter = DeadLetter(
        dlq_seq=dlq_seq,
        subject=_read(headers.get(ORIGINAL_SUBJECT, subject)),
        reason=_read(headers.get(REASON, "")),
        consumer=headers.get(CONSUMER, ""),
        stream_seq=stream_seq,
        dead_at=headers.get(DEAD_AT, ""),
        data=data,
        headers=headers,
        body_omitted=omitted,
        body_bytes=int(size) if size.isdigit() else len(data),
    )
    if not omitted:
        return letter
    original = await _original(js, stream_seq)
    if original is None:
        return dataclasses.replace(letter, original_missing=True)
    body, stored = original
    return dataclasses.replace(letter, data=body, stored_headers=stored if headers.get(HEADERS) == OMITTED else None)


async def _original(js: JetStreamContext, stream_seq: int | None) -> tuple[bytes, dict[str, str]] | None:
    """The original message in COS_EVENTS (body, headers as published), or None if it is gone."""
    if stream_seq is None:
        return None
    try:
        raw = await js.get_msg(EVENTS_STREAM, stream_seq)
    except nats.js.errors.NotFoundError:
        return None
    stored = {str(k): str(v) for k, v in (raw.headers or {}).items() if k != EXPECTED_STREAM}
    return raw.data or b"", stored


async def replay_dead_letter(
    js: JetStreamContext, letter: DeadLetter, timeout_s: float = 5.0, *, nc: Client | None = None
) -> int:
    """Send a dead letter back to its original subject, then remove it; returns the new stream seq.

    The replay gets a fresh `Nats-Msg-Id`: the original id may still be inside the event stream's
    duplicate window, which would silently drop it. It is addressed to the consumer that rejected it
    (`Cos-Replay-For`): the other consumers applied the original already, or dead-lettered it
    themselves (their own letter replays it to them), so they pass it by.
    """
    if letter.body_omitted and letter.original_missing:
        raise DeadLetterError(
            f"dead letter {letter.dlq_seq}: its body was too large to keep with it and the original "
            f"(COS_EVENTS seq {letter.stream_seq}) is no longer in the stream"
        )
    headers = letter.original_headers()
    headers[MSG_ID] = f"r-{letter.dlq_seq}-{int(time.time())}"
    if letter.consumer:
        headers[REPLAY_FOR] = letter.consumer
    check_fits(
        f"the replay of dead letter {letter.dlq_seq}",
        letter.data,
        with_stream_header(headers, EVENTS_STREAM),
        server_max_payload(nc if nc is not None else client_of(js)),
        "the server's max_payload is lower than when the event was stored; raise it to replay this event",
    )
    ack = await js.publish(letter.subject, letter.data, timeout=timeout_s, stream=EVENTS_STREAM, headers=headers)
    await js.delete_msg(DLQ_STREAM, letter.dlq_seq)
    return int(ack.seq)

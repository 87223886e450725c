"""The dead-letter stream: events that cannot be projected, kept with their reason for a replay.

A dead letter is the original payload and headers on `cos.dlq.<profile>.<session>.<type>` (or
`cos.dlq.unrouted`), plus `Cos-Dlq-*` headers saying why, by whom and from where. Its
`Nats-Msg-Id` derives from the consumer and stream sequence, so a consumer that dead-letters the
same delivery twice (it crashed before acking) stores it once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.proto.cloudevents import MSG_ID, percent_decode
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM, dlq_subject

REASON: Final = "Cos-Dlq-Reason"
CONSUMER: Final = "Cos-Dlq-Consumer"
ORIGINAL_SUBJECT: Final = "Cos-Dlq-Subject"
STREAM_SEQ: Final = "Cos-Dlq-Stream-Seq"
DEAD_AT: Final = "Cos-Dlq-Time"
MAX_REASON_CHARS: Final = 2000


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
    data: bytes
    headers: dict[str, str]

    def original_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if not k.startswith("Cos-Dlq-")}


def dead_letter_headers(msg: Msg, reason: str, consumer: str, stream_seq: int) -> dict[str, str]:
    # The original headers are kept as they came (NATS headers are one line already), for a faithful replay.
    headers = dict(msg.headers or {})
    headers.update(
        {
            REASON: _clean(reason),
            CONSUMER: consumer,
            ORIGINAL_SUBJECT: _clean(msg.subject, 512),
            STREAM_SEQ: str(stream_seq),
            DEAD_AT: datetime.now(UTC).isoformat(),
            MSG_ID: f"dlq-{consumer}-{stream_seq}",
        }
    )
    return headers


async def dead_letter(
    js: JetStreamContext, msg: Msg, reason: str, consumer: str, stream_seq: int, timeout_s: float = 5.0
) -> None:
    """Store `msg` in the dead-letter stream; raises if JetStream did not acknowledge it."""
    await js.publish(
        dlq_subject(msg.subject),
        msg.data,
        timeout=timeout_s,
        stream=DLQ_STREAM,
        headers=dead_letter_headers(msg, reason, consumer, stream_seq),
    )


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
        stream_seq = headers.get(STREAM_SEQ)
        letters.append(
            DeadLetter(
                dlq_seq=raw.seq or seq,
                subject=_read(headers.get(ORIGINAL_SUBJECT, raw.subject or "")),
                reason=_read(headers.get(REASON, "")),
                consumer=headers.get(CONSUMER, ""),
                stream_seq=int(stream_seq) if stream_seq and stream_seq.isdigit() else None,
                dead_at=headers.get(DEAD_AT, ""),
                data=raw.data or b"",
                headers=headers,
            )
        )
        seq += 1
    return letters


async def replay_dead_letter(js: JetStreamContext, letter: DeadLetter, timeout_s: float = 5.0) -> int:
    """Send a dead letter back to its original subject, then remove it; returns the new stream seq.

    The replay gets a fresh `Nats-Msg-Id`: the original id may still be inside the event stream's
    duplicate window, which would silently drop it.
    """
    headers = letter.original_headers()
    headers[MSG_ID] = f"replay-{letter.dlq_seq}-{int(time.time())}-{headers.get('ce-id', '')}"
    ack = await js.publish(letter.subject, letter.data, timeout=timeout_s, stream=EVENTS_STREAM, headers=headers)
    await js.delete_msg(DLQ_STREAM, letter.dlq_seq)
    return int(ack.seq)

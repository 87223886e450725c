"""Fuzz targets for sizes around the NATS payload limit on the dead-letter path.

* Pure: whatever the original's body, headers and reason, a dead letter fits the server's
  max_payload (headers counted), carries its reference (consumer, stream sequence, reason), and
  either the whole original body or none of it with its size.
* Integration: messages whose size (body and headers) is drawn around a 64 KiB server's limit,
  poison and valid, go through a real nats-server and PostgreSQL to the journal-writer. No
  connection is ever closed by the server; a message over the limit is refused before it is sent;
  every stored poison message is in COS_DLQ and its body can be read back; every valid one is
  projected.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Final

import msgspec
import nats
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM, subject_for
from commonos.runtime.dlq import (
    BODY,
    BODY_BYTES,
    CONSUMER,
    OMITTED,
    REASON,
    STREAM_SEQ,
    dead_letter_message,
    list_dead_letters,
)
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import MessageTooLarge, check_fits, message_bytes, with_stream_header
from commonos.runtime.nats import ensure_streams
from tests.factories import Clock, SessionBuilder
from tests.fuzz.conftest import PROFILE_ENV
from tests.support import journal_writer, table_checksums, wait_for_position

LONG: Final = os.environ.get(PROFILE_ENV) == "long"
LIMITS: Final = (4096, 64 * 1024, 1024 * 1024)

header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,30}", fullmatch=True)
header_values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300)


@st.composite
def originals(draw: st.DrawFn) -> tuple[Msg, int]:
    """A delivery of any size around a limit, with original headers of its own, and that limit."""
    limit = draw(st.sampled_from(LIMITS))
    headers = draw(st.dictionaries(header_names, header_values, max_size=8))
    around = draw(st.integers(-400, 400))
    size = max(0, limit - message_bytes(b"", headers) + around)
    body = draw(st.sampled_from([b"x", b"{", "é".encode()])) * size
    subject = draw(st.sampled_from([f"cos.events.default.{uuid.UUID(int=7)}.message_appended", "cos.events.x"]))
    return Msg(_client=None, subject=subject, data=body[:size], headers=headers or None), limit  # type: ignore[arg-type]


@given(
    originals(),
    st.text(max_size=3000),
    st.sampled_from(["journal-writer", "billing", "graph-writer-p3-of-8"]),
    st.integers(1, 2**63),
)
def test_a_dead_letter_always_fits_and_keeps_its_reference(
    original: tuple[Msg, int], reason: str, consumer: str, stream_seq: int
) -> None:
    msg, limit = original
    data, headers = dead_letter_message(msg, reason, consumer, stream_seq, limit)
    assert message_bytes(data, with_stream_header(headers, DLQ_STREAM)) <= limit
    assert headers[CONSUMER] == consumer and headers[STREAM_SEQ] == str(stream_seq) and REASON in headers
    if headers.get(BODY) == OMITTED:
        assert data == b"" and headers[BODY_BYTES] == str(len(msg.data))
    else:
        assert data == msg.data and BODY_BYTES not in headers


# --- integration ---------------------------------------------------------------------------------

SMALL: Final = 64 * 1024
MESSAGES: Final = 600 if LONG else 40


@dataclass(frozen=True)
class Sized:
    kind: str  # "valid", "orphan" (a message of a session that does not exist), "garbage" (not an event)
    over: int  # bytes over (positive) or under (negative) the limit, headers counted


def draw_sizes(n: int) -> list[Sized]:
    out: list[Sized] = []

    @settings(
        max_examples=n,
        phases=[Phase.generate],
        deadline=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        st.sampled_from(["valid", "orphan", "garbage"]),
        st.one_of(st.integers(-600, 64), st.integers(-SMALL + 600, -600)),
    )
    def collect(kind: str, over: int) -> None:
        out.append(Sized(kind, over))

    collect()
    return out


def build(sized: Sized, clock: Clock, limit: int) -> tuple[str, bytes, dict[str, str], ev.Event | None]:
    """Subject, body and headers of a message `sized.over` bytes from `limit`, and the event if it is one."""
    session = SessionBuilder("default", clock)
    session.create()
    turn = session.start_turn()
    create = session.events[0]

    def event(n: int) -> ev.Event:
        if sized.kind == "valid":
            assert isinstance(create, ev.SessionCreated)
            return msgspec.structs.replace(create, title="t" * n)
        return ev.MessageAppended(
            event_id=create.event_id,
            occurred_at=clock.now,
            profile_id="default",
            session_id=create.session_id,
            turn_id=turn,
            seq=1,
            content=UserMessage(text="ü" * (n // 2) + "u" * (n % 2)),
        )

    base = event(0)
    headers = event_headers(base)
    empty = message_bytes(ev.encode_event(base), with_stream_header(headers, EVENTS_STREAM))
    target = max(0, limit + sized.over - empty)
    if sized.kind == "garbage":
        body = b"[" * (len(ev.encode_event(base)) + target)
        return subject_for(base), body, headers, None
    e = event(target)
    return subject_for(e), ev.encode_event(e), event_headers(e), e


@pytest.mark.slow
async def test_messages_around_the_limit_never_close_a_connection_and_nothing_is_lost(
    small_nats_server: NatsServer, database_url: str
) -> None:
    limit = small_nats_server.max_payload
    assert limit == SMALL
    clock = Clock()
    nc = await nats.connect(small_nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        stored: dict[int, tuple[bytes, Sized]] = {}
        refused = 0
        for sized in draw_sizes(MESSAGES):
            subject, body, headers, _ = build(sized, clock, limit)
            try:
                check_fits("message", body, with_stream_header(headers, EVENTS_STREAM), limit)
            except MessageTooLarge:
                assert sized.over > 0 or message_bytes(body, headers) > limit
                refused += 1
                continue
            ack = await js.publish(subject, body, headers=dict(headers), stream=EVENTS_STREAM, timeout=5)
            stored[ack.seq] = (body, sized)
            assert nc.is_connected, "the server closed the publisher's connection"
        assert stored, "every drawn message was over the limit"
        last = max(stored)
        async with journal_writer(small_nats_server.url, database_url) as writer:
            await wait_for_position(database_url, "journal-writer", last, timeout_s=60)
            assert writer.task is not None and not writer.task.done(), "the writer stopped"
        letters = {d.stream_seq: d for d in await list_dead_letters(js)}
        poison = {seq for seq, (_, s) in stored.items() if s.kind != "valid"}
        assert set(letters) == poison, "every poison message dead-lettered, and only those"
        for seq in poison:
            assert letters[seq].data == stored[seq][0], f"the body of stream seq {seq} cannot be read back"
        valid = sum(1 for _, s in stored.values() if s.kind == "valid")
        assert (await table_checksums(database_url))["sessions"][0] == valid
        assert nc.is_connected
        print(
            f"dead-letter sizes: {len(stored)} stored ({len(poison)} poison, "
            f"{sum(1 for d in letters.values() if d.body_omitted)} kept by reference), {refused} refused before sending"
        )
    finally:
        await nc.close()

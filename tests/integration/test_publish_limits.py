"""The size budget at the producer: the server's max_payload counts headers and body; an event over it is
refused before anything is sent, and the connection stays open.

Runs against nats-server's default max_payload (1 MiB) and a 64 KiB one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import nats
import pytest

from commonos.cli.up import System
from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher, EventTooLarge, PublishError
from commonos.runtime.settings import Settings
from tests.factories import Clock

SOURCE = "urn:commonos:test"


def sized_message(limit: int, over: int) -> Callable[[], ev.MessageAppended]:
    """A user message whose message (headers included) is `over` bytes over `limit` (negative: under)."""
    clock = Clock()
    session, turn, event_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def make(n: int) -> ev.MessageAppended:
        return ev.MessageAppended(
            event_id=event_id,
            occurred_at=clock.now,
            profile_id="default",
            session_id=session,
            turn_id=turn,
            seq=1,
            content=UserMessage(text="é" * (n // 2) + "x" * (n % 2)),  # two-byte characters, like real text
        )

    base = _exact_size(make(0))
    return lambda: make(limit + over - base)


def _exact_size(e: ev.MessageAppended) -> int:
    """What nats-server counts: the body, the CloudEvents headers and JetStream's stream header."""
    return message_bytes(ev.encode_event(e), with_stream_header(event_headers(e, SOURCE), EVENTS_STREAM))


async def test_an_event_at_the_limit_is_stored_and_one_byte_over_is_refused(sized_nats_server: NatsServer) -> None:
    limit = sized_nats_server.max_payload
    assert limit is not None
    nc = await nats.connect(sized_nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, SOURCE)
        assert publisher.max_payload == limit
        at_limit = sized_message(limit, 0)()
        assert _exact_size(at_limit) == limit
        ack = await publisher.publish(at_limit)
        assert ack.seq == 1

        over = sized_message(limit, 1)()
        with pytest.raises(EventTooLarge) as refused:
            await publisher.publish(over)
        message = str(refused.value)
        assert "\n" not in message
        assert f"{limit + 1} bytes with its headers" in message and f"max_payload of {limit} bytes" in message
        assert "COS_NATS_MAX_PAYLOAD" in message, "says what to change"
        assert (refused.value.size, refused.value.limit) == (limit + 1, limit)

        # The connection is still open and usable: nothing of the refused event went out.
        assert nc.is_connected
        small = sized_message(2000, 0)()
        assert (await publisher.publish(small)).seq == 2
    finally:
        await nc.close()


async def test_a_batch_with_one_event_too_large_publishes_nothing(sized_nats_server: NatsServer) -> None:
    limit = sized_nats_server.max_payload
    assert limit is not None
    nc = await nats.connect(sized_nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, SOURCE)
        fine = [sized_message(1000 + i, 0)() for i in range(5)]
        too_large = sized_message(limit, 7)()
        with pytest.raises(EventTooLarge):
            await publisher.publish_many([*fine, too_large, *fine])
        assert (await js.stream_info(EVENTS_STREAM)).state.messages == 0
        assert nc.is_connected
        acks = await publisher.publish_many(fine)
        assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
    finally:
        await nc.close()


async def test_cos_up_starts_its_nats_server_with_cos_nats_max_payload(tmp_path: Path, database_url: str) -> None:
    env = {"COS_NATS_MAX_PAYLOAD": "65536", "COS_DATA_DIR": str(tmp_path / "cos"), "COS_DATABASE_URL": database_url}
    settings = Settings.from_env(env)
    assert settings.nats_max_payload == 65536
    system = System(settings)
    endpoints = system.start_servers()
    try:
        nc = await nats.connect(endpoints.nats_url)
        try:
            assert nc.max_payload == 65536
        finally:
            await nc.close()
    finally:
        system.stop()
    assert Settings.from_env({}).nats_max_payload is None, "unset: nats-server's own default (1 MiB)"


async def test_publishing_on_a_closed_connection_fails_at_once(nats_server: NatsServer) -> None:
    """nats-py never reopens a closed connection: the publisher says so instead of retrying for 30 s."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await ensure_streams(js)
    publisher = EventPublisher(js, SOURCE, deadline_s=30)
    await nc.close()
    started = time.monotonic()
    with pytest.raises(PublishError, match="connection is closed"):
        await publisher.publish(sized_message(1000, 0)())
    assert time.monotonic() - started < 1.0

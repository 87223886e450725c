"""The harness's nats-server is real: publish, durable pull consume, ack, survive SIGKILL."""

from __future__ import annotations

import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from commonos.proto.cloudevents import decode_headers
from commonos.proto.events import SessionCreated, decode_event
from commonos.proto.subjects import EVENTS_ALL, EVENTS_STREAM
from commonos.runtime.embedded import NatsServer, PostgresCluster, ServerStartError
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.harness import cleanup, make_temp_root


def _event() -> SessionCreated:
    return SessionCreated(profile_id="default", session_id=uuid.uuid4(), source="cli", title="hello")


async def test_publish_pull_consume_ack(js: JetStreamContext) -> None:
    await ensure_streams(js)
    await ensure_streams(js)  # idempotent
    event = _event()
    ack = await EventPublisher(js, "urn:test").publish(event)
    assert ack.stream == EVENTS_STREAM and ack.seq == 1

    sub = await js.pull_subscribe(
        EVENTS_ALL,
        durable="test-reader",
        stream=EVENTS_STREAM,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
    )
    [msg] = await sub.fetch(1, timeout=5)
    assert decode_event(msg.data) == event
    assert decode_headers(msg.headers)["id"] == str(event.event_id)
    await msg.ack_sync()
    info = await js.consumer_info(EVENTS_STREAM, "test-reader")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_republish_with_same_id_is_dropped(js: JetStreamContext) -> None:
    await ensure_streams(js)
    publisher = EventPublisher(js, "urn:test")
    event = _event()
    first = await publisher.publish(event)
    again = await publisher.publish(event)
    assert again.duplicate is True and again.seq == first.seq
    assert (await js.stream_info(EVENTS_STREAM)).state.messages == 1


async def test_acked_event_survives_sigkill(nats_server: NatsServer) -> None:
    nc: Client = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await ensure_streams(js)
    event = _event()
    await EventPublisher(js, "urn:test").publish(event)
    await nc.close()

    nats_server.kill()
    assert not nats_server.running
    nats_server.start()

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(EVENTS_ALL, durable="after-kill", stream=EVENTS_STREAM)
        [msg] = await sub.fetch(1, timeout=10)
        assert decode_event(msg.data) == event
        await msg.ack_sync()
    finally:
        await nc.close()


def test_a_server_that_cannot_start_fails_with_its_own_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("jetstream { max_file_store: lots }\n")
    with pytest.raises(ServerStartError) as err:
        NatsServer(tmp_path / "n", config_file=bad).start()
    assert "exited with code" in str(err.value)
    assert "max_file_store" in str(err.value) or "lots" in str(err.value)  # nats-server's own words


def test_postgres_that_cannot_start_fails_with_its_own_output(tmp_path: Path) -> None:
    root = make_temp_root("cos-badpg-")
    try:
        cluster = PostgresCluster(root / "pg", settings={"shared_buffers": "not-a-size"})
        with pytest.raises(ServerStartError) as err:
            cluster.start()
        assert "shared_buffers" in str(err.value)
    finally:
        cleanup(root)

"""Events near the NATS payload limit on the consuming side: dead letters by reference, connections
that die, and a lag gauge that tells the truth during a stall.

Every test runs against nats-server's default max_payload (1 MiB) and a 64 KiB one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.ids import new_id
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM, subject_for
from commonos.runtime.dlq import BODY, OMITTED, STREAM_SEQ, list_dead_letters, replay_dead_letter
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.nats import ensure_streams
from tests.billing.support import billing
from tests.factories import Clock, SessionBuilder
from tests.harness import PgServer
from tests.support import (
    ServiceProcess,
    http_status,
    journal_writer,
    publish_all,
    table_checksums,
    wait_for_position,
    wait_http,
)

pytestmark = pytest.mark.slow


def near_limit(event_of_size: object, limit: int, room: int) -> ev.MessageAppended:
    """A user message event whose message (body, CloudEvents headers, stream header) is `room` bytes under `limit`."""
    assert callable(event_of_size)

    def size(e: ev.MessageAppended) -> int:
        return message_bytes(ev.encode_event(e), with_stream_header(event_headers(e), EVENTS_STREAM))

    base = event_of_size(0)
    text_bytes = limit - room - size(base)
    event = event_of_size(text_bytes)
    assert size(event) == limit - room
    return event  # type: ignore[no-any-return]


async def publish_raw(js: JetStreamContext, events: list[ev.Event]) -> int:
    last = 0
    for e in events:
        ack = await js.publish(subject_for(e), ev.encode_event(e), headers=event_headers(e), stream=EVENTS_STREAM)
        last = ack.seq
    return last


async def test_a_poison_event_near_the_limit_is_dead_lettered_by_reference(
    sized_nats_server: NatsServer, database_url: str
) -> None:
    """Its dead letter with the `Cos-Dlq-*` headers would be over max_payload: before, the server closed the
    writer's connection and the writer retried the dead letter forever. Now the dead letter carries the
    reference, the writer goes on, and `cos dlq` reads the body from COS_EVENTS."""
    url, limit = sized_nats_server.url, sized_nats_server.max_payload
    assert limit is not None
    clock = Clock()
    orphan = SessionBuilder("default", clock)  # never created: its message is poison (no session)
    orphan.create()
    turn = orphan.start_turn()
    create, start = orphan.events[0], orphan.events[1]
    event_id = new_id()

    def orphan_message(n: int) -> ev.MessageAppended:
        return ev.MessageAppended(
            event_id=event_id,
            occurred_at=clock.now,
            profile_id="default",
            session_id=orphan.session_id,
            turn_id=turn,
            message_id=event_id,
            seq=1,
            content=UserMessage(text="x" * n),
        )

    poison = near_limit(orphan_message, limit, room=40)
    good = SessionBuilder("default", clock)
    good.create()
    good_turn = good.start_turn()
    good.message(good_turn, UserMessage(text="after the big one"))

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        poison_seq = await publish_raw(js, [poison])
        last = await publish_raw(js, good.events)
        async with journal_writer(url, database_url) as writer:
            await wait_for_position(database_url, "journal-writer", last, timeout_s=20)
            assert writer.task is not None and not writer.task.done(), "the writer stopped"

        raw = await js.get_msg(DLQ_STREAM, 1)
        assert raw.headers is not None and raw.headers[BODY] == OMITTED, "the body cannot fit with the reason"
        assert raw.headers[STREAM_SEQ] == str(poison_seq)
        assert not raw.data
        [letter] = await list_dead_letters(js)
        assert letter.body_omitted and not letter.original_missing
        assert letter.consumer == "journal-writer" and "ForeignKeyViolation" in letter.reason
        assert letter.data == ev.encode_event(poison), "the body is read back from COS_EVENTS by sequence"
        assert letter.body_bytes == len(letter.data)
        listed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "commonos.cli.main", "dlq", "list", "--format", "json"],
            env={**os.environ, "COS_NATS_URL": url, "COS_DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            check=True,
        )
        [row] = json.loads(listed.stdout)
        assert (row["stream_seq"], row["bytes"], row["body"]) == (poison_seq, len(letter.data), "in COS_EVENTS")

        # The fix arrives (the missing session), then the dead letter goes back and is projected.
        fixed = await publish_raw(js, [create, start])
        async with journal_writer(url, database_url):
            await wait_for_position(database_url, "journal-writer", fixed)
            replayed = await replay_dead_letter(js, letter)
            await wait_for_position(database_url, "journal-writer", replayed)
        assert await list_dead_letters(js) == []
        counts = await table_checksums(database_url)
        assert counts["messages"][0] == 2, "the replayed message and the good one"
    finally:
        await nc.close()


async def test_billing_dead_letters_a_model_call_near_the_limit_and_goes_on(
    sized_nats_server: NatsServer, database_url: str
) -> None:
    url, limit = sized_nats_server.url, sized_nats_server.max_payload
    assert limit is not None
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        session = SessionBuilder("default", Clock())
        session.create()
        turn = session.start_turn()
        session.model_call(turn)
        call = session.events[-1]
        assert isinstance(call, ev.ModelCallCompleted)
        # Undecodable as an event (a body of the right size that is not JSON), on billing's subject.
        subject = subject_for(call)
        headers = event_headers(call)
        body = b"{" * (limit - 40 - message_bytes(b"", with_stream_header(headers, EVENTS_STREAM)))
        await js.publish(subject, body, headers=headers, stream=EVENTS_STREAM)
        last = await publish_raw(js, [call])
        async with billing(url, database_url) as running:
            await wait_for_position(database_url, "billing", last, table="billing_positions", timeout_s=20)
            assert running.task is not None and not running.task.done(), "billing stopped"
        [letter] = await list_dead_letters(js)
        assert letter.consumer == "billing" and letter.body_omitted and letter.data == body
        assert "undecodable" in letter.reason
    finally:
        await nc.close()


def rotate_password(config: Path, user: str, password: str, server: NatsServer) -> None:
    config.write_text(f"authorization {{ users = [ {{user: {user}, password: {password}}} ] }}\n")
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGHUP)  # reload: connections that no longer authorize are closed with an error


async def test_a_writer_whose_connection_is_closed_exits_non_zero(
    tmp_path: Path, server_root: Path, database_url: str
) -> None:
    """nats-py reconnects after a network failure but not after a server error (here: the credentials
    were rotated); the writer must not sit there healthy and idle. It exits non-zero, saying why."""
    config = tmp_path / "auth.conf"
    config.write_text("authorization { users = [ {user: writer, password: one} ] }\n")
    server = NatsServer(server_root / "nats-auth", config_file=config).start()
    try:
        writer = ServiceProcess(
            "commonos.journal_writer",
            {
                "COS_NATS_URL": server.url,
                "COS_DATABASE_URL": database_url,
                "COS_NATS_USER": "writer",
                "COS_NATS_PASSWORD": "one",
            },
            tmp_path / "writer.log",
        ).start()
        await wait_http(writer.url + "/readyz", 200, timeout_s=30)
        rotate_password(config, "writer", "two", server)
        assert writer.proc is not None
        await asyncio.to_thread(_wait_exit, writer, 15)
        assert not writer.alive, f"the writer kept running on a closed connection:\n{writer.output()}"
        assert writer.proc.returncode == 1, writer.output()
        assert "NATS connection closed" in writer.output()
    finally:
        server.kill()


async def test_lag_and_readiness_tell_the_truth_while_postgres_is_down(
    sized_nats_server: NatsServer, database_url: str, pg_server: PgServer, tmp_path: Path
) -> None:
    """During a stall the lag gauge shows the backlog (not 0) and /readyz names PostgreSQL."""
    url = sized_nats_server.url
    clock = Clock()
    acks = await publish_all(url, _fresh_sessions(clock, 20))
    writer = ServiceProcess(
        "commonos.journal_writer", {"COS_NATS_URL": url, "COS_DATABASE_URL": database_url}, tmp_path / "writer.log"
    ).start()
    try:
        await wait_for_position(database_url, "journal-writer", acks[-1].seq, timeout_s=30)
        pg_server.stop()
        waiting = await publish_all(url, _fresh_sessions(clock, 30))
        deadline = time.monotonic() + 20
        lag = None
        while time.monotonic() < deadline:
            lag = _gauge(await _text(writer.url + "/metrics"), "cos_consumer_lag_events", 'consumer="journal-writer"')
            if lag == len(waiting):
                break
            await asyncio.sleep(0.2)
        assert lag == len(waiting), f"lag gauge {lag} during the stall, {len(waiting)} events waiting"
        assert await http_status(writer.url + "/readyz") == 503
        assert "PostgreSQL" in await _text(writer.url + "/readyz")
        assert await http_status(writer.url + "/healthz") == 200, "waiting out an outage is not a hang"
        pg_server.start()
        await wait_for_position(database_url, "journal-writer", waiting[-1].seq, timeout_s=30)
    finally:
        if pg_server.cluster is not None and not pg_server.cluster.running:
            pg_server.start()
        writer.terminate()


def _wait_exit(service: ServiceProcess, timeout_s: float) -> None:
    assert service.proc is not None
    with contextlib.suppress(subprocess.TimeoutExpired):
        service.proc.wait(timeout_s)


def _fresh_sessions(clock: Clock, n: int) -> list[ev.Event]:
    out: list[ev.Event] = []
    for _ in range(n):
        s = SessionBuilder("default", clock)
        s.create()
        out += s.events
    return out


async def _text(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


def _gauge(text: str, name: str, label: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None

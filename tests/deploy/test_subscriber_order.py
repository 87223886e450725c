"""The subscriber recipe of deploy/SUBSCRIBERS.md keeps each session's events in stream order across a crash.

The examples run as programs of their own with the subscriber user's credentials against a nats-server with the
users `cos up` gives it. Each is SIGKILLed once its consumer has acknowledged some events, in the middle of its
reading (with the earlier recipe: inside a fetched batch of 100), an event handled and perhaps not acknowledged.
Restarted, it must hand on every event after the
ones it handled, session by session in stream order, each once when duplicates are dropped by `event_id` as
the page says a handler must.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import signal
import time
import uuid
from collections import defaultdict

import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig

from commonos.proto import events as ev
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import EVENTS_STREAM
from tests.deploy.conftest import SecuredNats
from tests.deploy.test_subscriber_example import Example, example, node_examples, stored
from tests.factories import Clock, SessionBuilder

SESSIONS = 4
MESSAGES_PER_SESSION = 400
#: A short ack_wait for the test's consumer, so an event in flight at the crash comes back soon.
ACK_WAIT_S = 3
#: The example is killed once it has acknowledged this many events (within its first batch of 100 before).
KILL_AFTER = 50


def interleaved_sessions() -> list[ev.Event]:
    """SESSIONS sessions whose events alternate in the stream, as concurrent sessions' do."""
    clock = Clock()
    builders = [SessionBuilder("acme", clock, ("client:acme",)) for _ in range(SESSIONS)]
    turns = []
    for s in builders:
        s.create(title="order")
        turns.append(s.start_turn())
    for i in range(MESSAGES_PER_SESSION):
        for s, turn in zip(builders, turns, strict=True):
            s.message(turn, UserMessage(text=f"message {i} " + "x" * 40))
    by_session = [list(s.events) for s in builders]
    out: list[ev.Event] = []
    for i in range(max(len(events) for events in by_session)):
        out += [events[i] for events in by_session if i < len(events)]
    return out


def parse(line: str) -> tuple[int, str, str]:
    """(stream seq, subject, event id) of one printed line."""
    seq, _, subject, event_id = line.split(" ")
    return int(seq), subject, event_id


async def test_a_subscriber_killed_mid_batch_and_restarted_keeps_each_session_in_order(
    secured_nats: SecuredNats, example: Example
) -> None:
    if example.language == "typescript":  # one process to kill: tsx's command line runs node as a child
        example = dataclasses.replace(example, argv=["node", "--import", "tsx", "subscriber.ts"])
    events = interleaved_sessions()
    await stored(secured_nats, events)
    wanted = {str(e.event_id) for e in events}
    args = ("--durable", "ordered", "--ack-wait", str(ACK_WAIT_S))

    first = await example.start(secured_nats, *args)
    admin = (await secured_nats.connect("admin")).jetstream()
    # The pipe fills and the example blocks writing: it has handled some events and not all.
    deadline = time.monotonic() + 30
    while True:  # killed once it has handled some events (a Python example blocks on a full pipe anyway)
        try:
            acked = (await admin.consumer_info(EVENTS_STREAM, "ordered")).ack_floor.stream_seq
        except nats.js.errors.NotFoundError:
            acked = 0
        if acked >= KILL_AFTER:
            break
        assert time.monotonic() < deadline, "the example read nothing"
        await asyncio.sleep(0.02)
    assert acked < len(events), "the example read everything before it could be killed: publish more"
    first.proc.send_signal(signal.SIGKILL)
    out, _ = await asyncio.wait_for(first.proc.communicate(), 30)
    before = [parse(line) for line in out.decode().splitlines()]
    assert 0 < len(before) < len(events), len(before)

    second = await example.start(secured_nats, *args)
    after: list[tuple[int, str, str]] = []
    seen = {event_id for _, _, event_id in before}
    try:
        assert second.proc.stdout is not None
        while not wanted <= seen:
            line = await asyncio.wait_for(second.proc.stdout.readline(), 60)
            assert line, f"the restarted example stopped after {len(after)} events"
            after.append(parse(line.decode().rstrip("\n")))
            seen.add(after[-1][2])
    finally:
        second.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.proc.communicate(), 10)

    # What an idempotent handler applies: each event the first time it comes.
    applied: list[tuple[int, str, str]] = []
    done: set[str] = set()
    for seq, subject, event_id in before + after:
        if event_id not in done:
            done.add(event_id)
            applied.append((seq, subject, event_id))
    assert [event_id for _, _, event_id in applied if event_id not in wanted] == []
    assert len(applied) == len(events)
    per_session: dict[str, list[int]] = defaultdict(list)
    for seq, subject, _ in applied:
        per_session[subject.split(".")[3]].append(seq)
    out_of_order = {
        session: [(a, b) for a, b in itertools.pairwise(seqs) if b < a][:3]
        for session, seqs in per_session.items()
        if seqs != sorted(seqs)
    }
    assert out_of_order == {}, f"sessions whose events came out of stream order: {out_of_order}"
    assert {uuid.UUID(s) for s in per_session} == {e.session_id for e in events}
    print(f"{example.language}: killed after {len(before)} lines, {len(after)} after the restart, all in order")


async def test_the_example_s_consumer_expires_when_idle_and_has_one_event_in_flight(
    secured_nats: SecuredNats, example: Example
) -> None:
    events = interleaved_sessions()[:10]
    await stored(secured_nats, events)
    admin = (await secured_nats.connect("admin")).jetstream()
    # A consumer of the earlier recipe (1000 in flight, never removed) is brought to this one as it goes on.
    await admin.add_consumer(
        EVENTS_STREAM,
        ConsumerConfig(
            durable_name="older",
            filter_subject="cos.events.>",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30,
            max_ack_pending=1000,
        ),
    )
    for durable, extra in (("fresh", ()), ("older", ()), ("short", ("--inactive-threshold", "1h"))):
        code, _, err = await example.run(secured_nats, "--durable", durable, *extra, "--max", "2")
        assert (code, err) == (0, "")
        config = (await admin.consumer_info(EVENTS_STREAM, durable)).config
        expected_threshold = 3600.0 if durable == "short" else 7 * 86400.0
        assert (config.max_ack_pending, config.ack_wait, config.inactive_threshold) == (1, 30.0, expected_threshold)
    assert (await admin.consumer_info(EVENTS_STREAM, "older")).ack_floor.stream_seq == 2


__all__ = ["example", "node_examples"]  # the fixtures, shared with test_subscriber_example

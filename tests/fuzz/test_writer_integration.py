"""Integration fuzz target: fuzzed deliveries among valid events, through a real nats-server and
PostgreSQL, projected by the journal-writer running in-process.

Unlike the pure targets this one does not run examples one by one: it publishes a fixed number of
generated deliveries (300, or 10,000 under `COS_FUZZ_PROFILE=long`) interleaved with a few hundred
valid events, in one run of the writer, and then checks the outcome of every one of them:

* the writer reaches the end of the stream and its task never dies;
* a delivery that is not a valid event is in COS_DLQ with the reason `decode_delivery` (and the
  projection's invariant check) gives for it;
* a valid fuzzed event is either projected or dead-lettered as rejected by PostgreSQL;
* every valid event of the ordinary stream is projected, none is dead-lettered;
* no core table holds a row that no accepted event accounts for (no partial writes).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import asyncpg
import nats
import nats.errors
import nats.js.errors
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.journal_writer.store import JournalProjection
from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.subjects import subject_for
from commonos.runtime.consumer import decode_delivery
from commonos.runtime.dlq import MAX_REASON_CHARS, DeadLetter, list_dead_letters
from commonos.runtime.errors import DataError
from commonos.runtime.nats import ensure_streams
from tests.factories import event_stream
from tests.fuzz import strategies as fz
from tests.fuzz.conftest import PROFILE_ENV
from tests.support import journal_writer, position

pytestmark = pytest.mark.slow

LONG: Final = os.environ.get(PROFILE_ENV) == "long"
FUZZED: Final = 10_000 if LONG else 300
VALID: Final = 400
WRITER: Final = "journal-writer"
CATCH_UP_S: Final = 90.0


def generate_deliveries(n: int) -> list[fz.RawDelivery]:
    """`n` deliveries drawn by hypothesis (derandomized in the short profile, so `make test` repeats)."""
    out: list[fz.RawDelivery] = []

    @settings(
        max_examples=n,
        phases=[Phase.generate],
        deadline=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
    )
    @given(fz.deliveries(for_nats=True))
    def collect(delivery: fz.RawDelivery) -> None:
        out.append(delivery)

    collect()
    return out


def expected_reason(delivery: fz.RawDelivery) -> tuple[str | None, ev.Event | None]:
    """What the writer must make of a delivery: a dead-letter reason, or the event it projects."""
    msg = Msg(_client=None, subject=delivery.subject, data=delivery.data, headers=delivery.headers or None)  # type: ignore[arg-type]
    d = decode_delivery(msg, 1)
    if d.event is not None:
        try:
            JournalProjection(WRITER).check(d.event)
        except DataError as exc:  # what the consumer dead-letters (anything else would stop it)
            return f"invariant: {exc}", None
    return d.error, d.event


def one_line(reason: str) -> str:
    """A reason as the dead-letter header carries it: whitespace folded, length capped."""
    flat = " ".join(reason.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 1] + "…"


@dataclass
class RowIds:
    """The primary keys of the core tables an accepted set of events accounts for."""

    profiles: set[str] = field(default_factory=set)
    sessions: set[uuid.UUID] = field(default_factory=set)
    turns: set[uuid.UUID] = field(default_factory=set)
    messages: set[uuid.UUID] = field(default_factory=set)
    tool_calls: set[uuid.UUID] = field(default_factory=set)
    approvals: set[uuid.UUID] = field(default_factory=set)  # by tool call: one approval per call

    def add(self, events: Iterable[ev.Event]) -> RowIds:
        for e in events:
            match e:
                case ev.ProfileUpserted():
                    self.profiles.add(e.profile_id)
                case ev.SessionCreated():
                    self.profiles.add(e.profile_id)
                    self.sessions.add(e.session_id)
                case ev.TurnStarted():
                    self.turns.add(e.turn_id)
                case ev.MessageAppended():
                    self.messages.add(e.message_id)
                case ev.ToolCallRecorded():
                    self.tool_calls.add(e.tool_call_id)
                case ev.ApprovalDecided():
                    self.approvals.add(e.tool_call_id)
                case _:
                    pass
        return self

    def tables(self) -> dict[str, set[str] | set[uuid.UUID]]:
        return {
            "profiles": self.profiles,
            "sessions": self.sessions,
            "turns": self.turns,
            "messages": self.messages,
            "tool_calls": self.tool_calls,
            "approvals": self.approvals,
        }


async def stored_ids(dsn: str) -> RowIds:
    conn = await asyncpg.connect(dsn)
    try:
        rows = RowIds()
        for table, ids in rows.tables().items():
            key = "tool_call_id" if table == "approvals" else "id"
            ids.update(r[0] for r in await conn.fetch(f"SELECT {key} FROM {table}"))
        return rows
    finally:
        await conn.close()


async def publish_interleaved(
    js: JetStreamContext, fuzzed: Sequence[fz.RawDelivery], valid: Sequence[ev.Event], seed: int
) -> tuple[dict[int, fz.RawDelivery], dict[int, ev.Event], int]:
    """Publish both, valid events in their order; returns what landed at which stream sequence."""
    rng = random.Random(seed)
    slots = set(rng.sample(range(len(fuzzed) + len(valid)), len(fuzzed)))
    fuzzed_at: dict[int, fz.RawDelivery] = {}
    valid_at: dict[int, ev.Event] = {}
    fi = vi = last = 0
    for i in range(len(fuzzed) + len(valid)):
        if i in slots:
            d = fuzzed[fi]
            fi += 1
            try:
                ack = await js.publish(d.subject, d.data, headers=d.headers or None, timeout=5)
            except (nats.js.errors.Error, nats.errors.Error):
                continue  # refused by the server (a header it acts on, a subject it rejects): never stored
            if not ack.duplicate:
                fuzzed_at[ack.seq] = d
        else:
            e = valid[vi]
            vi += 1
            ack = await js.publish(subject_for(e), ev.encode_event(e), headers=event_headers(e), timeout=5)
            valid_at[ack.seq] = e
        last = max(last, ack.seq)
    return fuzzed_at, valid_at, last


async def writer_reaches(dsn: str, seq: int, task: asyncio.Task[int], timeout_s: float) -> None:
    """Wait for the writer's position to reach `seq`, failing at once if its task ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    at = 0
    while loop.time() < deadline:
        assert not task.done(), (
            f"the writer stopped at stream seq {at}: {task.exception() if not task.cancelled() else 'cancelled'}"
        )
        at = await position(dsn, WRITER)
        if at >= seq:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the writer is stuck at stream seq {at} of {seq} after {timeout_s}s (a retry loop?)")


def check_dead_letters(
    fuzzed_at: dict[int, fz.RawDelivery], valid_at: dict[int, ev.Event], letters: Sequence[DeadLetter]
) -> list[ev.Event]:
    """Every delivery's fate against its expected reason; returns the fuzzed events that were accepted."""
    by_seq = {letter.stream_seq: letter for letter in letters}
    assert len(by_seq) == len(letters), "a delivery was dead-lettered twice"
    assert all(letter.reason for letter in letters), "a dead letter without a reason"
    assert not set(by_seq) & set(valid_at), [by_seq[s].reason for s in set(by_seq) & set(valid_at)]
    assert set(by_seq) <= set(fuzzed_at), "a dead letter for a delivery that was never published"
    accepted: list[ev.Event] = []
    for seq, delivery in sorted(fuzzed_at.items()):
        reason, event = expected_reason(delivery)
        letter = by_seq.get(seq)
        if reason is not None:
            assert letter is not None, f"seq {seq} ({reason}) was not dead-lettered: {delivery}"
            assert letter.reason == one_line(reason), (seq, letter.reason, reason)
        elif letter is not None:
            # A well-formed event that refers to rows that do not exist (an update matching nothing, a
            # missing session) is rejected by the projection or by PostgreSQL.
            assert letter.reason.startswith(("rejected by PostgreSQL: ", "rejected: ")), (seq, letter.reason)
        else:
            assert event is not None
            accepted.append(event)
    return accepted


async def test_fuzzed_deliveries_are_dead_lettered_with_their_reason_and_write_nothing(
    nats_url: str, database_url: str, fuzz_report: Callable[[str], None]
) -> None:
    fuzzed = generate_deliveries(FUZZED)
    assert len(fuzzed) == FUZZED, "hypothesis stopped early"
    valid = list(event_stream(VALID, seed=23))
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        fuzzed_at, valid_at, last = await publish_interleaved(js, fuzzed, valid, seed=len(fuzzed))
        assert len(valid_at) == len(valid) and len(fuzzed_at) > len(fuzzed) // 2

        async with journal_writer(nats_url, database_url, name=WRITER) as writer:
            assert writer.task is not None
            await writer_reaches(database_url, last, writer.task, CATCH_UP_S)
            assert not writer.task.done(), "the writer died"
        letters = await list_dead_letters(js)
    finally:
        await nc.close()

    accepted = check_dead_letters(fuzzed_at, valid_at, letters)
    fuzz_report(
        f"fuzzed deliveries: {len(fuzzed)} generated, {len(fuzzed_at)} stored by JetStream, "
        f"{len(letters)} dead-lettered, {len(accepted)} accepted; {len(valid_at)} valid events among them"
    )
    stored = (await stored_ids(database_url)).tables()
    wanted = RowIds().add(valid).tables()
    legit = RowIds().add([*valid, *accepted]).tables()
    for table in stored:
        missing = wanted[table] - stored[table]
        assert not missing, f"{table}: valid events not projected: {sorted(map(str, missing))[:5]}"
        unexplained = stored[table] - legit[table]
        assert not unexplained, f"{table}: rows no accepted event accounts for: {sorted(map(str, unexplained))[:5]}"

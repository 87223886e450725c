"""The two consumers the journal-writer is measured against, on the same stream in the same run.

* The naive consumer: nats-py `fetch(1)`, the real `JournalProjection` applied to that one event
  with its position in one transaction, commit, ack. What a straightforward consumer does.
* The raw ceiling: nats-py `fetch(1000)`, msgspec decode, the rows of `plan_events` (the same rows
  the writer writes) written with one COPY per table for the inserts and the writer's own bulk
  UPDATE statements for the updates, in one transaction, then every message acked. No checks,
  no dedup, no position, no dead letters, no pipelining: the cost of the rows themselves.

Each reads the stream from its start through an ephemeral consumer of its own and writes into the
empty database it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg
import nats
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from commonos.journal_writer.projection import BULK, STATEMENTS, Plan, columns, plan_events, profiles_mentioned
from commonos.journal_writer.store import JournalProjection
from commonos.proto.events import Event, decode_event
from commonos.proto.subjects import EVENTS_ALL, EVENTS_STREAM
from commonos.runtime import postgres

POSITION_UPSERT: Final = """
    INSERT INTO projection_positions (consumer, stream_seq, updated_at) VALUES ($1, $2, now())
    ON CONFLICT (consumer) DO UPDATE SET stream_seq = EXCLUDED.stream_seq, updated_at = now()"""


@dataclass(frozen=True)
class Rate:
    events: int
    seconds: float
    #: Where the time went, in seconds, by step (fetch, decode+plan, write+commit, ack).
    steps: dict[str, float] = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


async def _subscribe(js: JetStreamContext, name: str) -> JetStreamContext.PullSubscription:
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=300.0,
        max_ack_pending=-1,
        inactive_threshold=60.0,
    )
    return await js.pull_subscribe(EVENTS_ALL, durable=name, stream=EVENTS_STREAM, config=config)


async def naive_consumer(nats_url: str, dsn: str, *, name: str, max_events: int, max_seconds: float) -> Rate:
    """Fetch one, apply it and its position in one transaction, ack; until either limit is reached."""
    nc = await nats.connect(nats_url)
    conn = await postgres.connect(dsn)  # the writer's own codecs
    js = nc.jetstream()
    sub = await _subscribe(js, name)
    projection = JournalProjection(name)
    done = 0
    started = time.perf_counter()
    try:
        while done < max_events and time.perf_counter() - started < max_seconds:
            (msg,) = await sub.fetch(1, timeout=10.0)
            event = decode_event(msg.data)
            projection.check(event)
            async with conn.transaction():
                await projection.apply(conn, [event])
                await conn.execute(POSITION_UPSERT, name, msg.metadata.sequence.stream)
            await projection.after_commit(conn, [event])
            await msg.ack()
            done += 1
        return Rate(done, time.perf_counter() - started)
    finally:
        await sub.unsubscribe()
        await js.delete_consumer(EVENTS_STREAM, name)
        await conn.close()
        await nc.close()


@dataclass(frozen=True)
class CopyTarget:
    table: str
    columns: tuple[str, ...]
    #: From the plan's row to the table's row, where they differ.
    shape: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None


#: The plan's insert statements as COPYs (the columns the writer's INSERT fills, in its order).
COPIES: Final[dict[str, CopyTarget]] = {
    "session_insert": CopyTarget(
        "sessions",
        ("id", "profile_id", "source", "title", "tags", "parent_session_id", "created_at", "updated_at"),
        lambda row: (*row, row[6]),  # updated_at = created_at, as the INSERT does
    ),
    "turn_insert": CopyTarget(
        "turns", ("id", "session_id", "profile_id", "parent_turn_id", "tags", "depth", "started_at")
    ),
    "message_insert": CopyTarget(
        "messages", ("id", "session_id", "turn_id", "profile_id", "seq", "role", "content", "created_at")
    ),
    "tool_call_insert": CopyTarget(
        "tool_calls",
        (
            "id",
            "turn_id",
            "session_id",
            "profile_id",
            "call_id",
            "name",
            "args",
            "result",
            "is_error",
            "risk",
            "approval",
            "started_at",
            "finished_at",
        ),
    ),
    "approval_insert": CopyTarget(
        "approvals", ("id", "tool_call_id", "turn_id", "profile_id", "status", "decided_by", "decided_at")
    ),
}

#: Profiles must exist before their sessions (a foreign key); the writer creates them on first mention too.
PROFILES_INSERT: Final = """
    INSERT INTO profiles (id, tags, created_at) SELECT id, '{}', at
    FROM unnest($1::text[], $2::timestamptz[]) AS r(id, at)
    ON CONFLICT (id) DO NOTHING"""


async def write_plan(conn: asyncpg.Connection, events: Sequence[Event], plan: Plan) -> int:
    """The plan's rows, one statement per table, parents first; returns how many rows were written."""
    written = 0
    mentioned = profiles_mentioned(events)
    if mentioned:
        ids, times = zip(*mentioned, strict=True)
        await conn.execute(PROFILES_INSERT, list(ids), list(times))
    for statement, sql in STATEMENTS.items():
        rows = plan.rows[statement]
        if not rows:
            continue
        written += len(rows)
        target = COPIES.get(statement)
        if target is not None:
            records = [target.shape(r) for r in rows] if target.shape is not None else rows
            await conn.copy_records_to_table(target.table, records=records, columns=list(target.columns))
        elif statement in BULK:
            await conn.execute(BULK[statement], *columns(statement, rows))
        else:
            await conn.executemany(sql, rows)
    return written


async def raw_ceiling(nats_url: str, dsn: str, *, name: str, events: int, fetch_batch: int = 1000) -> Rate:
    """The first `events` events of the stream: fetch 1000, one bulk write per table, one transaction, ack."""
    nc = await nats.connect(nats_url)
    # No JSON codec: COPY's jsonb encoder takes the plan's JSON text as it is.
    conn: asyncpg.Connection = await asyncpg.connect(dsn)
    js = nc.jetstream()
    sub = await _subscribe(js, name)
    done = 0
    steps = dict.fromkeys(("fetch", "plan", "write", "ack"), 0.0)
    started = time.perf_counter()
    try:
        while done < events:
            t0 = time.perf_counter()
            msgs = await sub.fetch(min(fetch_batch, events - done), timeout=10.0)
            t1 = time.perf_counter()
            batch = [decode_event(m.data) for m in msgs]
            plan = plan_events(batch)
            t2 = time.perf_counter()
            async with conn.transaction():
                await write_plan(conn, batch, plan)
            t3 = time.perf_counter()
            for m in msgs:
                await m.ack()
            t4 = time.perf_counter()
            for step, took in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[step] += took
            done += len(msgs)
        return Rate(done, time.perf_counter() - started, steps)
    finally:
        await sub.unsubscribe()
        await js.delete_consumer(EVENTS_STREAM, name)
        await conn.close()
        await nc.close()

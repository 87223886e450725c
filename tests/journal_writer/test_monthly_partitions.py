"""The tables that grow without end are partitioned by month: the schema, months made on demand, old layouts.

Real nats-server and PostgreSQL; the journal-writer and billing run as they do in production (`serve`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, date, datetime

import asyncpg
import msgspec
import pytest

from commonos.journal_writer import schema as core_schema
from commonos.journal_writer.replay import ReplayError, replay
from commonos.journal_writer.service import writer_schemas
from commonos.proto import events as ev
from commonos.proto.ids import GATEWAY_NAMESPACE, IMPORT_NAMESPACE, name_id, new_id
from commonos.proto.messages import UserMessage
from commonos.runtime import partitions, registry
from commonos.runtime.postgres import OldLayout, apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.billing.support import billing
from tests.factories import Clock, SessionBuilder, event_stream
from tests.harness import PgServer
from tests.support import (
    CORE_TABLES,
    fresh_database,
    journal_writer,
    publish_all,
    table_checksums,
    wait_for_position,
)

PARTITIONED = ("turns", "messages", "tool_calls", "approvals", "model_calls")


def test_the_tables_that_grow_are_declared_partitioned() -> None:
    declared = {t.name: t.partition_by for t in registry.tables() if t.partition_by is not None}
    assert declared == {
        "turns": "started_at",
        "messages": "created_at",
        "tool_calls": "started_at",
        "approvals": "decided_at",
        "model_calls": "created_at",
    }


async def _layout(dsn: str) -> dict[str, list[date]]:
    conn = await connect(dsn)
    try:
        out = {t: [p.month for p in await partitions.list_partitions(conn, t)] for t in PARTITIONED}
        defaults = await conn.fetchval("SELECT count(*) FROM pg_partitioned_table WHERE partdefid <> 0")
        assert defaults == 0, "no table has a default partition"
        return out
    finally:
        await conn.close()


async def test_the_schema_applied_twice_at_once_makes_each_month_once(database_url: str) -> None:
    conns = [await connect(database_url) for _ in range(3)]
    try:
        await asyncio.gather(*(apply_schemas(c, registry.schemas()) for c in conns))
        # and a writer making an odd month while a service applies its schema
        odd = datetime(2024, 2, 29, 23, 59, tzinfo=UTC)
        await asyncio.gather(
            apply_schemas(conns[0], registry.schemas()),
            partitions.ensure(conns[1], {"messages": [odd], "model_calls": [odd]}),
            partitions.ensure(conns[2], {"messages": [odd]}),
        )
        kinds: dict[str, str] = dict(
            await conns[0].fetch(  # type: ignore[arg-type]
                "SELECT relname, relkind::text FROM pg_class WHERE relname = ANY($1::text[])", list(PARTITIONED)
            )
        )
    finally:
        for c in conns:
            await c.close()
    assert kinds == dict.fromkeys(PARTITIONED, "p")
    layout = await _layout(database_url)
    this = partitions.month_of(datetime.now(UTC))
    ahead = [this]
    for _ in range(partitions.MONTHS_AHEAD):
        ahead.append(partitions.next_month(ahead[-1]))
    for table, months in layout.items():
        assert set(ahead) <= set(months), table
        assert len(months) == len(set(months))
    assert date(2024, 2, 1) in layout["messages"] and date(2024, 2, 1) in layout["model_calls"]
    assert date(2024, 2, 1) not in layout["turns"]


async def test_rows_of_a_month_without_a_partition_are_stored_in_a_new_one(nats_url: str, database_url: str) -> None:
    """An imported-looking session from March 2025 and one from this month: the writer and billing make the
    months they need; nothing lands anywhere else."""
    old = SessionBuilder("acme", Clock(datetime(2025, 3, 14, 12, tzinfo=UTC)), tags=("client:acme",)).create()
    turn = old.start_turn()
    old.message(turn, UserMessage(text="from the spring of 2025"))
    old.tool_call(turn, "c1", "shell", {"cmd": "ls"}, "ok", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED)
    old.clock.now = datetime(2025, 3, 31, 23, 59, 59, 995000, tzinfo=UTC)
    old.model_call(turn)  # ticks past midnight: 1 April 2025
    old.finish(turn)
    new = SessionBuilder("acme", Clock(datetime.now(UTC)), tags=("client:acme",)).create()
    turn2 = new.start_turn()
    new.message(turn2, UserMessage(text="today"))
    new.model_call(turn2)
    new.finish(turn2)
    stream = [*old.events, *new.events]
    acks = await publish_all(nats_url, stream)
    last_call = max(i for i, e in enumerate(stream) if isinstance(e, ev.ModelCallCompleted))
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
        await wait_for_position(database_url, "billing", acks[last_call].seq, table="billing_positions")

    layout = await _layout(database_url)
    assert date(2025, 3, 1) in layout["turns"] and date(2025, 3, 1) in layout["messages"]
    assert date(2025, 3, 1) in layout["tool_calls"] and date(2025, 3, 1) in layout["approvals"]
    assert date(2025, 4, 1) in layout["model_calls"]
    conn = await connect(database_url)
    try:
        stored = await conn.fetchval("SELECT count(*) FROM messages_p2025_03")
        calls = await conn.fetch("SELECT tableoid::regclass::text AS part FROM model_calls ORDER BY created_at")
        last_ten = await conn.fetch(
            "SELECT t.started_at, t.profile_id, t.status, t.depth, s.title FROM turns t "
            "JOIN sessions s ON s.id = t.session_id ORDER BY t.started_at DESC LIMIT 10"
        )
        approvals = await conn.fetch(
            "SELECT tc.name, tc.args, a.status, a.decided_at FROM approvals a "
            "JOIN tool_calls tc ON tc.id = a.tool_call_id ORDER BY a.decided_at DESC"
        )
    finally:
        await conn.close()
    assert stored == 1
    this = partitions.month_of(datetime.now(UTC))
    assert [c["part"] for c in calls] == ["model_calls_p2025_04", partitions.partition_name("model_calls", this)]
    assert [r["status"] for r in last_ten] == ["completed", "completed"]
    assert [(r["name"], r["status"]) for r in approvals] == [("shell", "approved")]


async def test_an_approval_is_its_first_decision_whatever_month_the_second_falls_in(
    nats_url: str, database_url: str
) -> None:
    """One approval a tool call (the id derives from it): a second decision, a month later, changes nothing."""
    s = SessionBuilder("acme", Clock(datetime(2025, 5, 31, 23, 59, 59, 990000, tzinfo=UTC))).create()
    turn = s.start_turn()
    call = s.tool_call(turn, "c1", "shell", {}, "ok", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED)
    first = next(e for e in s.events if isinstance(e, ev.ApprovalDecided))
    second = ev.ApprovalDecided(
        profile_id="acme",
        session_id=s.session_id,
        turn_id=turn,
        tool_call_id=call,
        call_id="c1",
        status=ev.ApprovalStatus.DENIED,
        decided_at=datetime(2025, 6, 2, tzinfo=UTC),
        decided_by="cli:late",
        occurred_at=datetime(2025, 6, 2, tzinfo=UTC),
    )
    # the second decision also in a later batch, applied one at a time (the single-row statement)
    acks = await publish_all(nats_url, [*s.events, second])
    async with journal_writer(nats_url, database_url, batch_size=1):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    again = await publish_all(nats_url, [second, second, second, second])  # the bulk statement (4 rows)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", again[-1].seq)
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT status, decided_at FROM approvals WHERE tool_call_id = $1", call)
    finally:
        await conn.close()
    assert [(r["status"], r["decided_at"]) for r in rows] == [("approved", first.decided_at)]


async def test_a_table_of_the_old_layout_is_refused_with_the_way_to_move_it(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await conn.execute("CREATE TABLE turns (id uuid PRIMARY KEY, started_at timestamptz NOT NULL)")
        with pytest.raises(OldLayout, match=r"turns was made unpartitioned by an older version.*cos replay --truncate"):
            await apply_schemas(conn, writer_schemas())
        # the lock was let go: another schema can be applied
        assert await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await conn.close()
    with pytest.raises(asyncpg.UndefinedTableError):
        c = await connect(database_url)
        try:
            await c.fetchval("SELECT count(*) FROM messages")
        finally:
            await c.close()


async def test_an_unpartitioned_database_moves_by_a_replay_into_the_new_layout(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    """A database of the older layout (each core table one table) holding what the stream holds: the writer
    refuses it, `cos replay` without --truncate names the tables, with --truncate rebuilds them partitioned,
    equal to what the live writer wrote."""
    stream = list(event_stream(1_500, seed=31))
    acks = await publish_all(nats_url, stream)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    want = await table_checksums(database_url, CORE_TABLES)
    assert want["messages"][0] > 100

    # the older layout: the same tables unpartitioned, holding the same rows
    old = await fresh_database(pg_server)
    src, dst = await asyncpg.connect(database_url), await asyncpg.connect(old)  # jsonb as its text
    try:
        unpartitioned = [dataclasses.replace(t, partition_by=None) for t in core_schema.TABLES]
        await dst.execute("\n".join(t.ddl() for t in unpartitioned))
        assert await dst.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'messages'") == "r"
        for table in unpartitioned:
            names = [c.name for c in table.columns]
            rows = await src.fetch(f"SELECT {', '.join(names)} FROM {table.name}")
            await dst.copy_records_to_table(table.name, records=[tuple(r) for r in rows], columns=names)
    finally:
        await src.close()
        await dst.close()

    with pytest.raises(OldLayout, match="made unpartitioned by an older version"):
        async with journal_writer(nats_url, old):
            await asyncio.sleep(30)  # the writer stops at once: this is never reached
    settings = Settings(nats_url=nats_url, database_url=old)
    with pytest.raises(ReplayError, match=r"turns, messages, tool_calls, approvals: made unpartitioned.*--truncate"):
        await replay(settings)
    result = await replay(settings, truncate=True)
    assert result.last_seq == acks[-1].seq
    assert await table_checksums(old, CORE_TABLES) == want
    conn = await connect(old)
    try:
        kinds = {
            r["relname"]: r["k"]
            for r in await conn.fetch(
                "SELECT relname, relkind::text AS k FROM pg_class WHERE relname = ANY($1::text[])", list(PARTITIONED)
            )
        }
    finally:
        await conn.close()
    assert kinds == {"turns": "p", "messages": "p", "tool_calls": "p", "approvals": "p"}


async def test_a_name_based_id_announced_again_at_another_time_is_stored_once(nats_url: str, database_url: str) -> None:
    """The OTLP gateway announces a turn in every request that has a record of it, each time at that record's
    time; a call can arrive by telemetry and again by import, at another time. With the time in the tables'
    keys, the writer and billing keep the first row of such an id in whatever month it was stored."""
    session = SessionBuilder("acme", Clock(datetime(2025, 1, 20, tzinfo=UTC))).create()
    turn_id = name_id(GATEWAY_NAMESPACE, "turn", "a-session", "a-turn")
    tool_call_id = name_id(GATEWAY_NAMESPACE, "tool", "a-session", "c1")
    call_id = name_id(IMPORT_NAMESPACE, "call", "a-session", "r1")
    stream: list[ev.Event] = list(session.events)
    for at in (datetime(2025, 1, 31, 23, 59, tzinfo=UTC), datetime(2025, 2, 1, 0, 1, tzinfo=UTC)):
        base = {"profile_id": "acme", "session_id": session.session_id, "occurred_at": at}
        stream += [
            ev.TurnStarted(**base, turn_id=turn_id),  # type: ignore[arg-type]
            ev.ToolCallRecorded(
                **base,  # type: ignore[arg-type]
                turn_id=turn_id,
                tool_call_id=tool_call_id,
                call_id="c1",
                name="shell",
                args={},
                result="ok",
                started_at=at,
                finished_at=at,
            ),
            ev.ModelCallCompleted(
                **base,  # type: ignore[arg-type]
                event_id=call_id,
                turn_id=turn_id,
                provider="openai",
                model="o4-mini",
                input_tokens=100,
                output_tokens=10,
            ),
        ]
    # one batch holding both, and again one at a time after they are stored
    acks = await publish_all(nats_url, stream)
    last_call = max(i for i, e in enumerate(stream) if isinstance(e, ev.ModelCallCompleted))
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
        await wait_for_position(database_url, "billing", acks[last_call].seq, table="billing_positions")
    again = [
        msgspec.structs.replace(e, event_id=new_id()) if not isinstance(e, ev.ModelCallCompleted) else e
        for e in stream[1:]
    ]
    acks = await publish_all(nats_url, again)
    async with journal_writer(nats_url, database_url, batch_size=1):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    conn = await connect(database_url)
    try:
        turns = await conn.fetch("SELECT started_at FROM turns WHERE id = $1", turn_id)
        tools = await conn.fetch("SELECT started_at FROM tool_calls WHERE id = $1", tool_call_id)
        calls = await conn.fetch("SELECT created_at FROM model_calls WHERE event_id = $1", call_id)
    finally:
        await conn.close()
    first = datetime(2025, 1, 31, 23, 59, tzinfo=UTC)
    assert [r["started_at"] for r in turns] == [first]
    assert [r["started_at"] for r in tools] == [first]
    assert [r["created_at"] for r in calls] == [first]

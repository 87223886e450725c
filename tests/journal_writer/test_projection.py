"""The journal-writer on real servers: the specification's tables, queries and search."""

from __future__ import annotations

import uuid

import nats
from prometheus_client import REGISTRY

from commonos.journal_writer.service import writer_schemas
from commonos.journal_writer.store import JournalProjection
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.subjects import subject_for
from commonos.runtime.consumer import BatchConsumer, decode_delivery
from commonos.runtime.http import Health
from commonos.runtime.postgres import apply_schemas, connect, create_pool
from tests.factories import Clock, SessionBuilder
from tests.harness import PgServer
from tests.support import fresh_database, journal_writer, publish_all, table_checksums, wait_for_position, wait_until

LAST_TEN_TURNS = """
SELECT t.started_at, t.profile_id, t.status, t.depth, s.title
FROM turns t JOIN sessions s ON s.id = t.session_id
ORDER BY t.started_at DESC
LIMIT 10;
"""

APPROVALS = """
SELECT tc.name, tc.args, a.status, a.decided_at
FROM approvals a JOIN tool_calls tc ON tc.id = a.tool_call_id
ORDER BY a.decided_at DESC;
"""


def realistic() -> tuple[list[ev.Event], dict[str, uuid.UUID]]:
    clock = Clock()
    events: list[ev.Event] = [
        ev.ProfileUpserted(profile_id="default", tags=("area:work", "team:core"), occurred_at=clock.tick()),
        ev.ProfileUpserted(profile_id="ops", tags=("team:ops",), occurred_at=clock.tick()),
    ]
    tags = ("area:work", "project:site", "team:core")
    parent = SessionBuilder("default", clock, tags).create()
    t1 = parent.start_turn(snapshot={"system_prompt": "Be brief.", "memory": ["likes tea"]})
    parent.message(t1, UserMessage(text="Do I need an umbrella in Charleston today?"))
    parent.message(t1, AssistantMessage(tool_calls=(ToolCall(id="c1", name="weather", args={"city": "Charleston"}),)))
    parent.tool_call(t1, "c1", "weather", {"city": "Charleston"}, "Charleston: 18°C, light rain")
    first_result = parent.message(t1, ToolResultMessage(call_id="c1", content="Charleston: 18°C, light rain"))
    parent.message(t1, AssistantMessage(text="Bring an umbrella: 18°C and light rain."))
    parent.model_call(t1)
    parent.finish(t1)

    t2 = parent.start_turn()
    parent.message(t2, UserMessage(text="Clean the old logs, then ask a helper to summarise the invoices."))
    parent.tool_call(
        t2,
        "c2",
        "shell",
        {"cmd": "rm -rf /var/log/old"},
        "removed 12 files",
        risk=ev.Risk.HIGH,
        approval=ev.ApprovalStatus.APPROVED,
    )
    parent.tool_call(
        t2,
        "c3",
        "shell",
        {"cmd": "shutdown now"},
        "denied by the approver",
        risk=ev.Risk.HIGH,
        approval=ev.ApprovalStatus.DENIED,
        is_error=True,
    )
    child = SessionBuilder("default", clock, tags).create(
        source="subagent", title="Summarise the invoices", parent_session_id=parent.session_id
    )
    ct = child.start_turn(parent_turn_id=t2, depth=1)
    child.message(ct, UserMessage(text="Summarise the invoices"))
    child.message(ct, AssistantMessage(text="Three invoices, 1,240 USD in total."))
    child.finish(ct)
    parent.tool_call(t2, "c4", "delegate", {"goal": "Summarise the invoices"}, "Three invoices, 1,240 USD in total.")
    parent.message(t2, AssistantMessage(text="Done: logs cleaned, invoices summarised."))
    parent.deactivate(first_result)
    parent.finish(t2)

    ops = SessionBuilder("ops", clock, ("team:ops",)).create(source="web", title="Disk usage")
    ot = ops.start_turn()
    ops.message(ot, UserMessage(text="How full is the disk?"))
    ops.finish(ot, ev.TurnStatus.FAILED, "model unavailable")

    # Interleave the two top sessions the way concurrent turns would be (each stays in order).
    events += parent.events[:8] + ops.events + parent.events[8:12] + child.events + parent.events[12:]
    ids = {
        "parent": parent.session_id,
        "child": child.session_id,
        "ops": ops.session_id,
        "t2": t2,
        "ct": ct,
        "deactivated": first_result,
    }
    return events, ids


async def test_realistic_sequence_yields_the_expected_rows(nats_url: str, database_url: str) -> None:
    events, ids = realistic()
    acks = await publish_all(nats_url, events)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)

    conn = await connect(database_url)
    try:
        counts = {
            t: await conn.fetchval(f"SELECT count(*) FROM {t}")
            for t in ("profiles", "sessions", "turns", "messages", "tool_calls", "approvals")
        }
        assert counts == {
            "profiles": 2,
            "sessions": 3,
            "turns": 4,
            "messages": 9,
            "tool_calls": 4,
            "approvals": 2,
        }
        assert await conn.fetchval("SELECT tags FROM profiles WHERE id = 'default'") == [
            "area:work",
            "team:core",
        ]

        sessions = {r["id"]: r for r in await conn.fetch("SELECT * FROM sessions")}
        parent, child, ops = sessions[ids["parent"]], sessions[ids["child"]], sessions[ids["ops"]]
        assert parent["title"] == "Do I need an umbrella in Charleston today?"  # first message, <= 60 chars
        assert parent["source"] == "cli" and parent["parent_session_id"] is None
        assert child["title"] == "Summarise the invoices" and child["source"] == "subagent"
        assert child["parent_session_id"] == ids["parent"]
        assert child["tags"] == parent["tags"] == ["area:work", "project:site", "team:core"]
        assert ops["title"] == "Disk usage"
        assert ops["profile_id"] == "ops"
        assert parent["context_snapshot"] == {"system_prompt": "Be brief.", "memory": ["likes tea"]}
        assert child["context_snapshot"] is None

        child_turn = await conn.fetchrow("SELECT * FROM turns WHERE id = $1", ids["ct"])
        assert child_turn["depth"] == 1 and child_turn["parent_turn_id"] == ids["t2"]
        assert child_turn["tags"] == ["area:work", "project:site", "team:core"]
        statuses = sorted(r["status"] for r in await conn.fetch("SELECT status FROM turns"))
        assert statuses == ["completed", "completed", "completed", "failed"]
        assert await conn.fetchval("SELECT error FROM turns WHERE status = 'failed'") == "model unavailable"

        seqs = [
            r["seq"]
            for r in await conn.fetch("SELECT seq FROM messages WHERE session_id = $1 ORDER BY seq", ids["parent"])
        ]
        assert seqs == list(range(1, 7))
        inactive = await conn.fetch("SELECT id FROM messages WHERE NOT active")
        assert [r["id"] for r in inactive] == [ids["deactivated"]]
        roles = await conn.fetchval("SELECT content FROM messages WHERE session_id = $1 AND seq = 2", ids["parent"])
        assert roles == {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "name": "weather", "args": {"city": "Charleston"}}],
        }

        # The seed's queries, verbatim.
        last_ten = await conn.fetch(LAST_TEN_TURNS)
        assert [(r["profile_id"], r["status"], r["depth"], r["title"]) for r in last_ten] == [
            # Ordered by the turns' own times: the ops turn was started last, though published earlier.
            ("ops", "failed", 0, "Disk usage"),
            ("default", "completed", 1, "Summarise the invoices"),
            ("default", "completed", 0, "Do I need an umbrella in Charleston today?"),
            ("default", "completed", 0, "Do I need an umbrella in Charleston today?"),
        ]
        approvals = await conn.fetch(APPROVALS)
        assert [(r["name"], r["args"], r["status"]) for r in approvals] == [
            ("shell", {"cmd": "shutdown now"}, "denied"),
            ("shell", {"cmd": "rm -rf /var/log/old"}, "approved"),
        ]

        # Full-text search over messages.search (GIN index), by a word in the text.
        found = await conn.fetch(
            "SELECT session_id, seq FROM messages WHERE search @@ plainto_tsquery('english', $1)", "umbrellas"
        )
        assert {(r["session_id"], r["seq"]) for r in found} == {(ids["parent"], 1), (ids["parent"], 4)}
        plan = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'messages_search'")
        assert "gin (search)" in plan

        # Deleting a profile removes its sessions, turns, messages, tool calls and approvals.
        await conn.execute("DELETE FROM profiles WHERE id = 'default'")
        left = {
            t: await conn.fetchval(f"SELECT count(*) FROM {t}")
            for t in ("sessions", "turns", "messages", "tool_calls", "approvals")
        }
        assert left == {"sessions": 1, "turns": 1, "messages": 1, "tool_calls": 0, "approvals": 0}
    finally:
        await conn.close()


async def test_republished_events_change_nothing(nats_url: str, database_url: str) -> None:
    events, _ = realistic()
    acks = await publish_all(nats_url, events)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    before = await table_checksums(database_url)

    # Republished with the same ids: JetStream drops them inside its duplicate window.
    again = await publish_all(nats_url, events)
    assert all(a.duplicate for a in again)

    # Republished after the window (no Nats-Msg-Id): new stream entries, absorbed by the natural keys.
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for e in events:
            last = await js.publish(subject_for(e), ev.encode_event(e))
        assert not last.duplicate and last.seq == 2 * len(events)
    finally:
        await nc.close()
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", last.seq)
    assert await table_checksums(database_url) == before


def skipped(consumer: str) -> float:
    value = REGISTRY.get_sample_value("cos_consumer_redeliveries_skipped_total", {"consumer": consumer})
    return value or 0.0


async def test_redelivery_after_a_missed_ack_changes_nothing(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    events, _ = realistic()
    acks = await publish_all(nats_url, events)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    expected = await table_checksums(database_url)

    # A writer that commits a batch and dies before acking it: the batch is redelivered.
    other = await fresh_database(pg_server)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        conn = await connect(other)
        await apply_schemas(conn, writer_schemas())
        await conn.close()
        pool = await create_pool(other)
        consumer = BatchConsumer(js, pool, JournalProjection("crashy"), Health())
        sub = await js.pull_subscribe(
            "cos.events.>", durable="crashy", stream="COS_EVENTS", config=consumer.consumer_config()
        )
        msgs = await sub.fetch(len(events), timeout=5)
        assert len(msgs) == len(events)
        await consumer._commit([decode_delivery(m, m.metadata.sequence.stream) for m in msgs])
        for m in msgs:
            await m.nak()  # as good as a lost ack, without waiting out ack_wait
        await pool.close()
    finally:
        await nc.close()
    async with journal_writer(nats_url, other, name="crashy"):
        # Every event comes back, and the committed position keeps each from being applied twice.
        await wait_until(lambda: skipped("crashy") == len(events))
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info("COS_EVENTS", "crashy")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await nc.close()
    assert await table_checksums(other) == expected

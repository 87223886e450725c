"""`cos retention`: months dropped whole, exactly those asked, exported first when asked; the seed's queries still
answer. Real nats-server and PostgreSQL; the rows are written by the journal-writer and billing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import asyncpg
import duckdb
import msgspec
import pytest
from prometheus_client import REGISTRY

from commonos.proto.messages import UserMessage
from commonos.runtime import partitions, retention
from commonos.runtime.postgres import connect
from tests.billing.support import billing
from tests.factories import Clock, SessionBuilder
from tests.support import journal_writer, publish_all, wait_for_position

CORE = ("turns", "messages", "tool_calls", "approvals")
SEED_LAST_TEN = (
    "SELECT t.started_at, t.profile_id, t.status, t.depth, s.title FROM turns t "
    "JOIN sessions s ON s.id = t.session_id ORDER BY t.started_at DESC LIMIT 10"
)
SEED_APPROVALS = (
    "SELECT tc.name, tc.args, a.status, a.decided_at FROM approvals a "
    "JOIN tool_calls tc ON tc.id = a.tool_call_id ORDER BY a.decided_at DESC"
)


def _months_ago(n: int) -> datetime:
    month = partitions.month_of(datetime.now(UTC))
    index = month.year * 12 + month.month - 1 - n
    return datetime(index // 12, index % 12 + 1, 10, 12, tzinfo=UTC)


async def _fill(nats_url: str, dsn: str, months_ago: list[int]) -> dict[int, SessionBuilder]:
    """One session a month, `n` months ago for each n: a turn, two messages, an approved tool call, a model
    call, the turn finished."""
    from commonos.proto import events as ev

    sessions: dict[int, SessionBuilder] = {}
    stream: list[ev.Event] = []
    for n in months_ago:
        s = SessionBuilder("acme", Clock(_months_ago(n)), tags=("client:acme",)).create()
        turn = s.start_turn()
        s.message(turn, UserMessage(text=f"{n} months ago"))
        s.tool_call(turn, "c1", "shell", {"n": n}, "ok", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED)
        s.model_call(turn)
        s.message(turn, UserMessage(text="and again"))
        s.finish(turn)
        sessions[n] = s
        stream += s.events
    acks = await publish_all(nats_url, stream)
    last_call = max(i for i, e in enumerate(stream) if isinstance(e, ev.ModelCallCompleted))
    async with journal_writer(nats_url, dsn), billing(nats_url, dsn):
        await wait_for_position(dsn, "journal-writer", acks[-1].seq)
        await wait_for_position(dsn, "billing", acks[last_call].seq, table="billing_positions")
    return sessions


def _cos(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env["COS_DATABASE_URL"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli", "retention", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _counts(dsn: str) -> dict[str, list[date]]:
    conn = await connect(dsn)
    try:
        return {
            t: [p.month for p in await partitions.list_partitions(conn, t) if await _rows(conn, p.name)]
            for t in (*CORE, "model_calls")
        }
    finally:
        await conn.close()


async def _rows(conn: object, name: str) -> int:
    """The partition's rows; 0 once it is gone (a service's retention may drop it between listing and counting)."""
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {name}"))  # type: ignore[attr-defined]
    except asyncpg.UndefinedTableError:
        return 0


def test_keeping_n_months_keeps_the_month_that_ended_n_months_ago() -> None:
    assert retention.cutoff(datetime(2026, 12, 5, tzinfo=UTC), 3) == date(2026, 9, 1)
    assert retention.cutoff(datetime(2026, 1, 31, 23, 59, tzinfo=UTC), 1) == date(2025, 12, 1)
    assert retention.cutoff(datetime(2026, 3, 1, tzinfo=UTC), 14) == date(2025, 1, 1)


async def test_retention_drops_exactly_the_months_asked_and_the_seed_queries_still_answer(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    await _fill(nats_url, database_url, [0, 2, 5, 6, 14])
    before = await _counts(database_url)
    months = {n: partitions.month_of(_months_ago(n)) for n in (0, 2, 5, 6, 14)}
    assert set(before["messages"]) == set(months.values())

    dry = _cos(database_url, "--keep-months", "5", "--dry-run", "--format", "json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] is True
    assert {(d["table"], d["month"]) for d in planned["dropped"]} == {
        (t, m.isoformat()[:7]) for t in CORE for m in (months[6], months[14])
    }
    assert await _counts(database_url) == before, "a dry run drops nothing"

    export = tmp_path / "archive"
    run = _cos(database_url, "--keep-months", "5", "--export", str(export))
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("dropped ") == 8, run.stdout
    after = await _counts(database_url)
    for table in CORE:
        assert sorted(after[table]) == sorted([months[0], months[2], months[5]]), table
    assert sorted(after["model_calls"]) == sorted(months.values()), "model_calls kept: it was not asked"

    # the exported months, as DuckDB reads them, hold exactly the dropped rows
    manifest = json.loads((export / "manifest.json").read_text())
    assert {(e["table"], e["month"]) for e in manifest["exports"]} == {
        (t, m.isoformat()[:7]) for t in CORE for m in (months[6], months[14])
    }
    texts = duckdb.sql(f"SELECT content FROM '{export}/messages/*.parquet' ORDER BY created_at").fetchall()
    assert [json.loads(t[0])["text"] for t in texts] == ["14 months ago", "and again", "6 months ago", "and again"]
    approvals = duckdb.sql(f"SELECT count(*), min(status) FROM '{export}/approvals/*.parquet'").fetchall()[0]
    assert approvals == (2, "approved")
    for entry in manifest["exports"]:
        assert entry["rows"] == 2 if entry["table"] in ("messages",) else entry["rows"] >= 1
        assert "search" not in {c["name"] for c in entry["columns"]}, "a generated column is not exported"

    conn = await connect(database_url)
    try:
        last_ten = await conn.fetch(SEED_LAST_TEN)
        approved = await conn.fetch(SEED_APPROVALS)
        per_client = await conn.fetch(
            "SELECT tag, sum(cost_usd) AS usd, count(*) AS calls FROM model_calls, unnest(tags) AS tag "
            "WHERE tag LIKE 'client:%' AND created_at >= date_trunc('month', now()) GROUP BY tag ORDER BY usd DESC"
        )
        sessions = await conn.fetchval("SELECT count(*) FROM sessions")
    finally:
        await conn.close()
    assert len(last_ten) == 3 and all(r["title"] for r in last_ten)
    assert [r["args"]["n"] if isinstance(r["args"], dict) else json.loads(r["args"])["n"] for r in approved] == [
        0,
        2,
        5,
    ]
    assert [(r["tag"], r["calls"]) for r in per_client] == [("client:acme", 1)]
    assert sessions == 5, "sessions stay"

    # model_calls only with its own retention; a second run finds nothing more of the core to drop
    calls = _cos(database_url, "--model-calls-keep-months", "3")
    assert calls.returncode == 0, calls.stderr
    assert sorted((await _counts(database_url))["model_calls"]) == sorted([months[0], months[2]])
    again = _cos(database_url, "--keep-months", "5")
    assert again.returncode == 0 and "nothing to drop" in again.stdout


async def test_a_late_row_of_a_dropped_month_is_stored_again(nats_url: str, database_url: str) -> None:
    """A month dropped, then an event of it arrives (a late import): the writer makes its partition again."""
    await _fill(nats_url, database_url, [0, 8])
    assert _cos(database_url, "--keep-months", "3").returncode == 0
    late = SessionBuilder("acme", Clock(_months_ago(8))).create()
    turn = late.start_turn()
    late.message(turn, UserMessage(text="late"))
    acks = await publish_all(nats_url, late.events)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    conn = await connect(database_url)
    try:
        name = partitions.partition_name("messages", partitions.month_of(_months_ago(8)))
        assert await conn.fetchval(f"SELECT count(*) FROM {name}") == 1
    finally:
        await conn.close()


def test_retention_without_months_says_what_to_give(database_url: str) -> None:
    run = _cos(database_url)
    assert run.returncode == 2
    assert "--keep-months N (or COS_RETENTION_MONTHS)" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


async def test_the_services_drop_what_their_retention_settings_no_longer_keep(
    nats_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COS_RETENTION_MONTHS: the journal-writer drops old months of the core tables as it starts (and hourly);
    billing keeps model_calls until COS_MODEL_CALLS_RETENTION_MONTHS asks."""
    await _fill(nats_url, database_url, [0, 8])
    old = partitions.month_of(_months_ago(8))
    monkeypatch.setenv("COS_RETENTION_MONTHS", "3")

    async def gone(tables: tuple[str, ...]) -> bool:
        layout = await _counts(database_url)
        return all(old not in layout[t] for t in tables)

    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        deadline = asyncio.get_running_loop().time() + 30
        while not await gone(CORE):
            assert asyncio.get_running_loop().time() < deadline, "the core's old month was not dropped"
            await asyncio.sleep(0.2)
    assert old in (await _counts(database_url))["model_calls"], "model_calls kept without its own setting"
    monkeypatch.setenv("COS_MODEL_CALLS_RETENTION_MONTHS", "3")
    async with billing(nats_url, database_url):
        deadline = asyncio.get_running_loop().time() + 30
        while not await gone(("model_calls",)):
            assert asyncio.get_running_loop().time() < deadline, "model_calls' old month was not dropped"
            await asyncio.sleep(0.2)
    dropped = REGISTRY.get_sample_value("cos_retention_months_dropped_total", {"table": "model_calls"})
    assert dropped is not None and dropped >= 1


GRAPH_ROWS = (
    "graph.sessions",
    "graph.user_inputs",
    "graph.model_invocations",
    "graph.assistant_messages",
    "graph.tool_uses",
    "graph.tool_results",
    "graph.file_touches",
    "graph.vendor_ids",
)


async def _graph_counts(dsn: str) -> dict[str, int]:
    conn = await connect(dsn)
    try:
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in GRAPH_ROWS}
    finally:
        await conn.close()


async def test_the_graph_keeps_the_same_months_its_old_sessions_go_whole_with_their_nested_ones(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    """Imported sessions (the session graph) are kept for the months the core keeps: a session that started
    before them goes with its nested session and every row of both, exported first when asked; a session of a
    month kept is untouched, and the core's months are dropped in the same run."""
    from commonos.journal_writer.service import serve, writer_projections, writer_schemas
    from commonos.runtime.settings import Settings
    from tests.console.test_imported import claude_session
    from tests.support import InProcess, wait_caught_up

    old, kept = _months_ago(7), _months_ago(1)
    old_tree, _ = claude_session("acme", "old work", old)
    # its nested session started in a month kept: it goes with its parent all the same
    root, nested = old_tree.graph.sessions
    old_tree = msgspec.structs.replace(
        old_tree,
        graph=msgspec.structs.replace(
            old_tree.graph, sessions=[root, msgspec.structs.replace(nested, started_at=_months_ago(0))]
        ),
    )
    kept_tree, _ = claude_session("acme", "recent work", kept)
    await _fill(nats_url, database_url, [0, 7])
    await publish_all(nats_url, [old_tree, kept_tree])
    settings = Settings(nats_url=nats_url, database_url=database_url, http_port=0)
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, writer_projections(), writer_schemas(), "journal-writer", stop=running.stop)
    )
    import nats

    nc = await nats.connect(nats_url)
    try:
        await wait_caught_up(nc.jetstream(), database_url, "graph-writer", table="graph.positions")
    finally:
        await nc.close()
        assert await running.close() == 0
    before = await _graph_counts(database_url)
    assert before["graph.sessions"] == 4 and before["graph.file_touches"] == 2

    dry = _cos(database_url, "--keep-months", "3", "--dry-run", "--format", "json")
    assert dry.returncode == 0, dry.stderr
    planned = [d for d in json.loads(dry.stdout)["dropped"] if d["deleted"]]
    assert [(d["table"], d["month"], d["rows"]) for d in planned] == [
        ("graph.sessions", partitions.month_of(old).isoformat()[:7], 1)
    ], "the dry run counts the month's own sessions"
    assert await _graph_counts(database_url) == before, "a dry run deletes nothing"

    export = tmp_path / "archive"
    run = _cos(database_url, "--keep-months", "3", "--export", str(export))
    assert run.returncode == 0, run.stderr
    assert f"deleted graph.sessions of {partitions.month_of(old).isoformat()[:7]}" in run.stdout, run.stdout
    after = await _graph_counts(database_url)
    assert after == {t: n // 2 for t, n in before.items()}, "exactly the old tree went, every row of it"
    conn = await connect(database_url)
    try:
        titles = [r["title"] for r in await conn.fetch("SELECT title FROM graph.sessions ORDER BY started_at")]
        old_core = partitions.partition_name("messages", partitions.month_of(old))
        assert await conn.fetchval("SELECT to_regclass($1)", old_core) is None, "the core's month dropped too"
    finally:
        await conn.close()
    assert titles == ["recent work", "subagent: look around"]

    # what was deleted is in the export, table by table, as DuckDB reads it
    manifest = json.loads((export / "manifest.json").read_text())
    graph_entries = {e["table"]: e for e in manifest["exports"] if e["table"].startswith("graph.")}
    assert set(GRAPH_ROWS) <= set(graph_entries), "every table whose rows cascade from a session is exported"
    for table in GRAPH_ROWS:
        assert graph_entries[table]["rows"] == before[table] - after[table], table
        rows = duckdb.sql(f"SELECT count(*) FROM '{export / graph_entries[table]['file']}'").fetchall()[0][0]
        assert rows == before[table] - after[table], table
    exported = duckdb.sql(f"SELECT title FROM '{export}/graph.sessions/*.parquet' ORDER BY started_at").fetchall()
    # (the nested session started this month, after its parent)
    assert [t[0] for t in exported] == ["old work", "subagent: look around"]

    again = _cos(database_url, "--keep-months", "3")
    assert again.returncode == 0 and "nothing to drop" in again.stdout, again.stdout


def test_the_journal_writer_keeps_the_graph_for_the_months_of_the_core() -> None:
    """COS_RETENTION_MONTHS covers the graph the journal-writer writes; COS_MODEL_CALLS_RETENTION_MONTHS does not."""
    from commonos.journal_writer.service import writer_projections

    tables = [t for p in writer_projections() for t in p.tables]
    plan = retention.service_plan(retention.RetentionSettings(keep_months=3), tables)
    assert plan["graph.sessions"] == 3 and plan["messages"] == 3
    assert retention.tables_expiring()["graph.sessions"] == ("id", "started_at")
    assert retention.service_plan(retention.RetentionSettings(model_calls_keep_months=3), tables) == {}

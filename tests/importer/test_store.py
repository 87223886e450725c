"""Importing into the graph tables on real servers: idempotent re-imports, grown transcripts, cascades."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.js import JetStreamContext

from commonos.accounting.pricing import Pricer
from commonos.importer.cli import SOURCES, ImportRun, Watcher, import_files, nats_publisher
from commonos.importer.events import has_usage
from commonos.journal_writer.graph_projection import GraphProjection
from commonos.journal_writer.graph_schema import GRAPH_TABLES
from commonos.journal_writer.service import serve, writer_schemas
from commonos.proto.events import ModelCallCompleted, TranscriptImported
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM
from commonos.runtime.postgres import connect
from commonos.runtime.settings import Settings
from tests.importer.transcripts import (
    ClaudeWriter,
    CodexWriter,
    append_lines,
    copy_corpus,
    needs_corpus,
    small_claude_home,
)
from tests.support import InProcess, publish_all, wait_caught_up

WRITER = "graph-writer"
#: The columns a re-import may change, per graph_projection's docstring; every other column never changes.
MUTABLE = {
    "graph.sessions": {"ended_at", "outcome", "title", "working_dir", "git_branch", "repo_root", "worktree_root"},
    "graph.user_inputs": {"interrupted"},
    "graph.model_invocations": {
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cache_write_1h_tokens",
        "total_tokens",
        "token_basis",
        "speed",
        "stop_reason",
    },
    "graph.tool_uses": {"status", "metadata"},
}
Snapshot = dict[str, dict[str, dict[str, Any]]]


@contextlib.asynccontextmanager
async def graph_writer(nats_url: str, dsn: str) -> AsyncIterator[InProcess]:
    settings = Settings(nats_url=nats_url, database_url=dsn, http_port=0)
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, [GraphProjection()], writer_schemas(), WRITER, stop=running.stop)
    )
    try:
        yield running
    finally:
        if not running.task.done():
            await running.close()
        elif running.task.exception() is not None:
            raise running.task.exception()  # type: ignore[misc]


async def stream_state(js: JetStreamContext) -> tuple[int, int]:
    """(last sequence, model_call_completed messages) of the events stream."""
    info = await js.stream_info(EVENTS_STREAM, subjects_filter="cos.events.*.*.model_call_completed")
    return info.state.last_seq, sum((info.state.subjects or {}).values())


async def caught_up(js: JetStreamContext, dsn: str) -> None:
    # The graph-writer reads only transcript_imported events: wait for its consumer, not the stream's end.
    await wait_caught_up(js, dsn, WRITER, table="graph.positions")


async def snapshot(dsn: str) -> Snapshot:
    conn = await connect(dsn)
    try:
        out: Snapshot = {}
        for table in GRAPH_TABLES:
            rows = await conn.fetch(f"SELECT to_jsonb(t) AS row FROM {table} t")
            keyed: dict[str, dict[str, Any]] = {}
            for record in rows:
                row = record["row"]
                key = row.get("id") or "/".join(
                    str(row[k]) for k in ("our_type", "vendor", "vendor_id_kind", "vendor_id")
                )
                keyed[key] = row
            out[table] = keyed
        return out
    finally:
        await conn.close()


def changes(before: Snapshot, after: Snapshot) -> dict[str, dict[str, set[str]]]:
    """Per table, the earlier rows whose columns changed (and which); a vanished row is a failure."""
    found: dict[str, dict[str, set[str]]] = {}
    for table, rows in before.items():
        for key, row in rows.items():
            assert key in after[table], f"{table} row {key} disappeared"
            changed = {column for column, value in row.items() if after[table][key][column] != value}
            if changed:
                found.setdefault(table, {})[key] = changed
    return found


async def import_all(root: Path, settings: Settings, *, settle_s: float = 10.0) -> dict[str, ImportRun]:
    pricer = Pricer()
    runs = {}
    async with nats_publisher(settings) as (publish, max_payload):
        for name in ("claude", "codex"):
            runs[name] = await import_files(
                SOURCES[name], root / name, pricer, publish=publish, max_payload=max_payload, settle_s=settle_s
            )
    return runs


def published(runs: dict[str, ImportRun]) -> tuple[int, int, int]:
    events = sum(r.published.events for r in runs.values())
    stored = sum(r.published.stored for r in runs.values())
    duplicates = sum(r.published.duplicates for r in runs.values())
    return events, stored, duplicates


@needs_corpus
async def test_reimporting_the_corpus_adds_rows_and_changes_none(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    corpus = copy_corpus(tmp_path)
    settings = Settings(nats_url=nats_url)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with graph_writer(nats_url, database_url):
            first = await import_all(corpus, settings)
            assert all(not r.errors for r in first.values())
            events, stored, duplicates = published(first)
            assert stored == events and duplicates == 0
            last_seq, calls = await stream_state(js)
            assert last_seq == events
            await caught_up(js, database_url)
            before = await snapshot(database_url)
            with_usage = [
                m
                for source in ("claude", "codex")
                for tree in SOURCES[source].top_files(corpus / source)
                for item in SOURCES[source].read(tree)
                for m in item.graph.model_invocations
                if has_usage(m)
            ]
            # One billed call per invocation with usage, and every invocation stored.
            assert calls == len(with_usage) == 843
            assert len(before["graph.model_invocations"]) >= len(with_usage)
            assert len(before["graph.sessions"]) == 15 + 8  # 15 trees, 8 nested subagent sessions

            second = await import_all(corpus, settings)
            events, stored, duplicates = published(second)
            assert stored == 0 and duplicates == events > 0, "an unchanged import must publish nothing new"
            assert (await stream_state(js))[0] == last_seq
            assert await snapshot(database_url) == before

            claude_file = corpus / "claude/projects/-Users-chip-dev-ai-music/fed8ce56-bc79-401f-a83e-af084253362f.jsonl"
            codex_file = next((corpus / "codex").rglob("rollout-2025-11-13T18-21-11-*.jsonl"))
            append_lines(claude_file, ClaudeWriter(claude_file).exchange("Now tag the release"))
            append_lines(codex_file, CodexWriter(codex_file).exchange("Run the tests too"))
            third = await import_all(corpus, settings)
            events, stored, _ = published(third)
            assert stored > 0
            await caught_up(js, database_url)
            after = await snapshot(database_url)
            changed = changes(before, after)
            grown_roots = {
                item.graph.sessions[0].id
                for path, source in ((claude_file, "claude"), (codex_file, "codex"))
                for item in SOURCES[source].read(path)
            }
            # Only the two grown sessions changed, and only in the columns a grown transcript completes.
            assert set(changed) <= {"graph.sessions"}, changed
            assert set(changed.get("graph.sessions", {})) <= grown_roots
            for columns in changed.get("graph.sessions", {}).values():
                assert columns <= MUTABLE["graph.sessions"]
                assert "ended_at" in columns
            for table in ("graph.user_inputs", "graph.model_invocations", "graph.tool_uses", "graph.tool_results"):
                assert len(after[table]) > len(before[table]), table
            for table in GRAPH_TABLES:
                assert len(after[table]) >= len(before[table])

            # The grown Codex rollout's last call is still open (no stop reason, file just written): it is billed
            # by the import that finds the file settled, and nothing else is published again.
            _, calls_before = await stream_state(js)
            fourth = await import_all(corpus, settings, settle_s=0)
            events, stored, _ = published(fourth)
            _, calls_after = await stream_state(js)
            assert stored == 1 and calls_after == calls_before + 1
            await caught_up(js, database_url)
            settled = await snapshot(database_url)
            assert settled == after
            stored_with_usage = [
                row
                for row in settled["graph.model_invocations"].values()
                if row["input_tokens"] + row["output_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"]
            ]
            assert calls_after == len(stored_with_usage)

        # Deleting a session removes everything it holds, nested sessions and vendor ids included.
        root = next(iter(grown_roots))
        conn = await connect(database_url)
        try:
            tree = await conn.fetch(
                "WITH RECURSIVE t AS (SELECT id FROM graph.sessions WHERE id = $1 "
                "UNION ALL SELECT s.id FROM graph.sessions s JOIN t ON s.parent_session_id = t.id) SELECT id FROM t",
                uuid.UUID(root),
            )
            ids = [r["id"] for r in tree]
            await conn.execute("DELETE FROM graph.sessions WHERE id = $1", uuid.UUID(root))
            for table in GRAPH_TABLES:
                column = "id" if table == "graph.sessions" else "session_id"
                left = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {column} = ANY($1::uuid[])", ids)
                assert left == 0, table
            assert await conn.fetchval("SELECT count(*) FROM graph.vendor_ids") > 0
        finally:
            await conn.close()
    finally:
        await nc.close()


async def test_a_watch_follows_a_growing_transcript(tmp_path: Path, nats_url: str, database_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=2)
    path = sorted((home / "projects").glob("*/*.jsonl"))[0]
    lines: list[str] = []
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with (
            graph_writer(nats_url, database_url),
            nats_publisher(Settings(nats_url=nats_url)) as (publish, max_payload),
        ):
            watcher = Watcher(
                SOURCES["claude"], home, Pricer(), publish, max_payload=max_payload, settle_s=3600, say=lines.append
            )
            await watcher.start()
            assert watcher.run.published.graph_parts == 2 and watcher.run.published.model_calls == 4
            await watcher.poll()
            assert watcher.run.published.events == 6, "nothing changed, nothing is sent"

            # A response still being written: its row is stored, its usage not billed yet.
            writer = ClaudeWriter(path, seed="watch")
            append_lines(
                path,
                [
                    writer.prompt("Summarise the changes"),
                    writer.response(
                        "msg_live", [{"type": "text", "text": "So far"}], output_tokens=1, stop_reason=None
                    ),
                ],
            )
            await watcher.poll()
            assert watcher.run.published.graph_parts == 3 and watcher.run.published.model_calls == 4
            await caught_up(js, database_url)
            conn = await connect(database_url)
            try:
                open_row = await conn.fetchrow(
                    "SELECT m.id, m.output_tokens, m.stop_reason FROM graph.model_invocations m "
                    "JOIN graph.vendor_ids v ON v.our_id = m.id WHERE v.vendor_id = 'msg_live'"
                )
                assert open_row is not None and open_row["output_tokens"] == 1 and open_row["stop_reason"] is None

                # The rest of the response arrives: the row is completed and the call billed with the final usage.
                append_lines(
                    path,
                    [
                        writer.response(
                            "msg_live",
                            [{"type": "text", "text": " and done"}],
                            output_tokens=240,
                            stop_reason="end_turn",
                        )
                    ],
                )
                await watcher.poll()
                await watcher.finish()
                assert watcher.run.published.model_calls == 5
                await caught_up(js, database_url)
                done = await conn.fetchrow(
                    "SELECT output_tokens, stop_reason FROM graph.model_invocations WHERE id = $1", open_row["id"]
                )
                assert done is not None and (done["output_tokens"], done["stop_reason"]) == (240, "end_turn")
            finally:
                await conn.close()
            msgs = await js.pull_subscribe("cos.events.claude-code.*.model_call_completed", stream=EVENTS_STREAM)
            fetched = await msgs.fetch(10, timeout=2)
            outputs = sorted(msgspec.json.decode(m.data)["output_tokens"] for m in fetched)
            assert len(fetched) == 5 and 240 in outputs and 1 not in outputs
            assert any("graph part" in line for line in lines)
    finally:
        await nc.close()


async def test_a_graph_that_breaks_the_model_is_dead_lettered(tmp_path: Path, nats_url: str, database_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    tree = SOURCES["claude"].read(next((home / "projects").glob("*/*.jsonl")))[0]
    root = tree.graph.root()
    assert root is not None
    broken = msgspec.structs.replace(tree.graph, tool_uses=[])
    bad = TranscriptImported(
        profile_id="claude-code",
        session_id=uuid.UUID(root.id),
        vendor="claude-code",
        graph=broken,
    )
    call = ModelCallCompleted(profile_id="claude-code", session_id=uuid.UUID(root.id), provider="anthropic", model="m")
    await publish_all(nats_url, [bad, call])
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with graph_writer(nats_url, database_url):
            await caught_up(js, database_url)
        dead = await js.stream_info(DLQ_STREAM)
        assert dead.state.messages == 1
        assert all(not rows for rows in (await snapshot(database_url)).values())
    finally:
        await nc.close()

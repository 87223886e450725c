"""`cos replay` rebuilds every projection the live writer keeps (core, session graph, memory) at once."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import nats

from commonos.accounting.pricing import Pricer
from commonos.importer.cli import SOURCES, import_files, nats_publisher
from commonos.journal_writer.graph_schema import GRAPH_TABLES
from commonos.journal_writer.replay import replay
from commonos.journal_writer.service import serve, writer_projections, writer_schemas
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.settings import Settings
from tests.factories import event_stream
from tests.harness import PgServer
from tests.importer.transcripts import small_claude_home
from tests.loop.test_memory_schema import random_changes
from tests.support import CORE_TABLES, InProcess, fresh_database, publish_all, table_checksums, wait_caught_up

#: memory_changes_applied is left out: its applied_at says when, which a rebuild changes by design.
ALL_TABLES = (*CORE_TABLES, *GRAPH_TABLES, "memory_entries")


async def test_replay_rebuilds_core_graph_and_memory_tables_as_the_live_writer_did(
    nats_url: str, database_url: str, pg_server: PgServer, tmp_path: Path
) -> None:
    core = list(event_stream(3_000, seed=23))
    memory = random_changes(random.Random(5), 200)
    await publish_all(nats_url, [*core, *memory])
    settings = Settings(nats_url=nats_url, database_url=database_url, http_port=0)
    async with nats_publisher(settings) as (publish, max_payload):
        run = await import_files(
            SOURCES["claude"],
            small_claude_home(tmp_path, sessions=3),
            Pricer(),
            publish=publish,
            max_payload=max_payload,
            settle_s=0,
        )
    assert not run.errors and run.published.stored > 0

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        stream = await js.stream_info(EVENTS_STREAM)
        transcripts = await js.stream_info(EVENTS_STREAM, subjects_filter="cos.events.*.*.transcript_imported")
        graph_events = sum((transcripts.state.subjects or {}).values())
        assert graph_events == 3
        created = await js.stream_info(EVENTS_STREAM, subjects_filter="cos.events.*.*.session_created")
        sessions_created = sum((created.state.subjects or {}).values())
        live = InProcess()
        live.task = asyncio.create_task(
            serve(settings, writer_projections(), writer_schemas(), "journal-writer", stop=live.stop)
        )
        try:
            await wait_caught_up(js, database_url, "journal-writer")
            await wait_caught_up(js, database_url, "graph-writer", table="graph.positions")
            await wait_caught_up(js, database_url, "memory-writer")
        finally:
            assert await live.close() == 0
    finally:
        await nc.close()
    want = await table_checksums(database_url, ALL_TABLES)
    assert all(want[t][0] > 0 for t in ("messages", "graph.sessions", "graph.model_invocations", "memory_entries"))

    rebuilt = await fresh_database(pg_server)
    progress: list[tuple[int, int]] = []
    result = await replay(
        Settings(nats_url=nats_url, database_url=rebuilt),
        on_progress=lambda done, total: progress.append((done, total)),
    )
    # Every event to the core pass; transcripts to the graph's; memory changes and, for their owners, every
    # session_created to the memory pass.
    deliveries = stream.state.messages + graph_events + len(memory) + sessions_created
    assert result.applied + result.skipped == deliveries
    assert result.last_seq == stream.state.last_seq
    assert progress[-1] == (deliveries, deliveries)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert await table_checksums(rebuilt, ALL_TABLES) == want

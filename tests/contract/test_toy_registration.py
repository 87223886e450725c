"""A projection registered once is picked up by `cos up`'s schemas, the journal-writer and `cos replay`, with
nothing else edited (the toy of tests/contract/toy_projection.py, registered for these tests only)."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg
import pytest

from commonos.cli.up import all_schemas
from commonos.journal_writer.replay import replay
from commonos.journal_writer.service import writer_projections, writer_schemas
from commonos.runtime import registry
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.contract import toy_projection
from tests.factories import event_stream
from tests.harness import PgServer
from tests.support import fresh_database, publish_all


@pytest.fixture
def toy() -> Iterator[registry.Registration]:
    with registry.registered("9-toy", toy_projection.REGISTRATION) as registration:
        yield registration


async def test_cos_up_applies_a_registered_projections_table(toy: registry.Registration, pg_server: PgServer) -> None:
    assert toy.schema in all_schemas() and toy.schema in writer_schemas()
    assert toy.tables[0] in registry.tables()
    dsn = await fresh_database(pg_server)
    conn = await connect(dsn)
    try:
        await apply_schemas(conn, all_schemas())
        columns = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'toy_outputs' "
            "ORDER BY ordinal_position"
        )
    finally:
        await conn.close()
    assert [(c["column_name"], c["data_type"]) for c in columns] == [
        ("event_id", "uuid"),
        ("profile_id", "text"),
        ("session_id", "uuid"),
        ("model", "text"),
        ("output_tokens", "bigint"),
        ("created_at", "timestamp with time zone"),
    ]


def test_without_its_registration_nothing_runs_it() -> None:
    assert not any(isinstance(p, toy_projection.ToyProjection) for p in writer_projections())
    assert toy_projection.REGISTRATION.schema not in all_schemas()


async def test_the_journal_writer_and_cos_replay_run_a_registered_projection(
    toy: registry.Registration, nats_url: str, pg_server: PgServer
) -> None:
    partition = writer_projections("-p1-of-2", unpartitioned=False)
    assert [p.name for p in partition if isinstance(p, toy_projection.ToyProjection)] == ["toy-writer-p1-of-2"]
    events = list(event_stream(300, seed=41))
    await publish_all(nats_url, events)
    dsn = await fresh_database(pg_server)
    result = await replay(Settings(nats_url=nats_url, database_url=dsn))
    assert result.applied > 0
    conn = await asyncpg.connect(dsn)
    try:
        stored = await conn.fetchval("SELECT count(*) FROM toy_outputs")
        position = await conn.fetchval("SELECT stream_seq FROM toy_positions WHERE consumer = 'toy-writer'")
    finally:
        await conn.close()
    calls = sum(1 for e in events if type(e).__name__ == "ModelCallCompleted")
    assert calls > 0 and stored >= calls
    assert position is not None and 0 < position <= result.last_seq

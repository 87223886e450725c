"""The harness's PostgreSQL is real: a fresh database per test, and it can be killed and restarted."""

from __future__ import annotations

import asyncpg

from commonos.runtime.postgres import apply_schemas, connect
from tests.harness import PgServer


async def test_round_trip(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, body jsonb)")
        await conn.execute("INSERT INTO t VALUES (1, $1)", {"a": [1, "ü"]})
        assert await conn.fetchval("SELECT body FROM t WHERE id = 1") == {"a": [1, "ü"]}
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 1
    finally:
        await conn.close()


async def test_each_test_gets_an_empty_database(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    finally:
        await conn.close()


async def test_schema_applies_twice_under_the_lock(database_url: str) -> None:
    script = "CREATE TABLE IF NOT EXISTS a (id int); CREATE INDEX IF NOT EXISTS a_id ON a (id);"
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, [script])
        await apply_schemas(conn, [script])
        assert await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = 'a_id'") == 1
    finally:
        await conn.close()


async def test_committed_row_survives_sigkill(pg_server: PgServer, database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    await conn.execute("CREATE TABLE k (v text)")
    await conn.execute("INSERT INTO k VALUES ('kept')")
    await conn.close()
    pg_server.kill()
    pg_server.start()
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT v FROM k") == "kept"
    finally:
        await conn.close()

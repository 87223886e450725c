"""`session_search` on PostgreSQL: the core `messages` table's generated tsvector, read-only."""

from __future__ import annotations

import asyncpg
import pytest

from commonos.loop.search import NoSearch, PostgresMessageSearch, SearchUnavailable
from commonos.loop.service import open_search
from commonos.proto.ids import new_id
from commonos.proto.text import escape_nul
from commonos.runtime.postgres import connect
from commonos.runtime.settings import Settings
from tests.harness import Replicated

# The shape of the core table (the journal-writer owns it); 'simple' to check the config is read from it.
MESSAGES = """
CREATE TABLE messages (
    id uuid PRIMARY KEY, session_id uuid NOT NULL, turn_id uuid NOT NULL, profile_id text NOT NULL,
    seq integer NOT NULL, role text NOT NULL, content jsonb NOT NULL, active boolean NOT NULL DEFAULT true,
    search tsvector GENERATED ALWAYS AS (
        to_tsvector('simple', coalesce(content->>'text', '') || ' ' || coalesce(content->>'content', ''))
    ) STORED
);
CREATE INDEX messages_search ON messages USING gin (search);
"""


async def test_search_reads_the_messages_table(database_url: str) -> None:
    conn = await connect(database_url)
    here, other = new_id(), new_id()
    try:
        await conn.execute(MESSAGES)
        rows = [
            ("default", other, 1, "user", {"role": "user", "text": "Where is my umbrella?"}),
            ("default", other, 2, "tool_result", {"role": "tool_result", "call_id": "c", "content": "umbrella: hall"}),
            ("default", here, 1, "user", {"role": "user", "text": "umbrella again"}),
            ("work", new_id(), 1, "user", {"role": "user", "text": "umbrella budget"}),
        ]
        for profile, session, seq, role, content in rows:
            await conn.execute(
                "INSERT INTO messages (id, session_id, turn_id, profile_id, seq, role, content)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)",
                new_id(),
                session,
                new_id(),
                profile,
                seq,
                role,
                content,
            )
    finally:
        await conn.close()

    search = await PostgresMessageSearch.connect(database_url)
    try:
        hits = await search.search("default", "umbrella", limit=5, exclude_session=here)
        assert search.ts_config == "simple"
        assert sorted((h.seq, h.role, h.text) for h in hits) == [
            (1, "user", "Where is my umbrella?"),
            (2, "tool_result", "umbrella: hall"),
        ]
        assert {h.session_id for h in hits} == {other}
        assert await search.search("default", "hall -umbrella") == []
        # the connections are read-only
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await search.pool.execute("DELETE FROM messages")
    finally:
        await search.close()


async def test_no_table_is_search_unavailable(database_url: str) -> None:
    search = await PostgresMessageSearch.connect(database_url, ts_config="english")
    try:
        with pytest.raises(SearchUnavailable):
            await search.search("default", "anything")
    finally:
        await search.close()


async def test_search_finds_and_shows_text_stored_escaped(database_url: str) -> None:
    """A message holding U+0000 is stored escaped (`commonos.proto.text`): a hit shows the original text,
    and a query holding U+0000 is looked up as stored instead of failing."""
    conn = await connect(database_url)
    try:
        await conn.execute(MESSAGES)
        await conn.execute(
            "INSERT INTO messages (id, session_id, turn_id, profile_id, seq, role, content)"
            " VALUES ($1, $2, $3, 'default', 1, 'tool_result', $4)",
            new_id(),
            new_id(),
            new_id(),
            {"role": "tool_result", "call_id": "c", "content": escape_nul("exit code 0\nbinary a\x00b ␀ here")},
        )
    finally:
        await conn.close()
    search = await PostgresMessageSearch.connect(database_url)
    try:
        [hit] = await search.search("default", "binary")
        assert hit.text == "exit code 0\nbinary a\x00b ␀ here"
        [same] = await search.search("default", "a\x00b")
        assert same.text == hit.text
    finally:
        await search.close()


async def test_the_loop_searches_the_read_replica(replicated_pg: Replicated, replica_database: tuple[str, str]) -> None:
    """With COS_DATABASE_READ_URL the loop service's session_search reads the replica (a real streaming one): a
    message stored while its replay is paused is found once it has replayed it."""
    primary, replica = replica_database

    async def store(text: str) -> None:
        conn = await connect(primary)
        try:
            await conn.execute(
                "INSERT INTO messages (id, session_id, turn_id, profile_id, seq, role, content)"
                " VALUES ($1, $2, $3, 'default', 1, 'user', $4)",
                new_id(),
                new_id(),
                new_id(),
                {"role": "user", "text": text},
            )
        finally:
            await conn.close()

    conn = await connect(primary)
    try:
        await conn.execute(MESSAGES)
    finally:
        await conn.close()
    await store("the umbrella is in the hall")
    await replicated_pg.caught_up()

    search = await open_search(Settings(database_url=primary, database_read_url=replica))
    assert isinstance(search, PostgresMessageSearch)
    try:
        assert await search.pool.fetchval("SELECT pg_is_in_recovery()") is True
        assert [h.text for h in await search.search("default", "umbrella")] == ["the umbrella is in the hall"]
        await replicated_pg.pause()
        await store("a bicycle in the shed")
        assert await search.search("default", "bicycle") == []
        await replicated_pg.resume()
        await replicated_pg.caught_up()
        assert [h.text for h in await search.search("default", "bicycle")] == ["a bicycle in the shed"]
    finally:
        await search.close()
    on_primary = await open_search(Settings(database_url=primary))
    assert isinstance(on_primary, PostgresMessageSearch)
    try:
        assert await on_primary.pool.fetchval("SELECT pg_is_in_recovery()") is False
    finally:
        await on_primary.close()
    assert isinstance(await open_search(Settings()), NoSearch)

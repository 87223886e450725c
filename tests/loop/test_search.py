"""`session_search` on PostgreSQL: the core `messages` table's generated tsvector, read-only."""

from __future__ import annotations

import asyncpg
import pytest

from commonos.loop.search import PostgresMessageSearch, SearchUnavailable
from commonos.proto.ids import new_id
from commonos.proto.text import escape_nul
from commonos.runtime.postgres import connect

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

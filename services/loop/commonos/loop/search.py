"""Full-text search over a profile's past messages, for the `session_search` tool.

`PostgresMessageSearch` reads the core `messages` table (written by the journal-writer, never by the
loop) through its generated `search` tsvector, on read-only connections (the loop service opens them on the read
replica, COS_DATABASE_READ_URL, when there is one: a message is found once the replica has replayed it); the table
holds text escaped (`commonos.proto.text`), so a query is escaped the same way and a hit shows the original text.
`MemoryMessageSearch` does the same over a `MemoryJournal`'s events, for tests.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Protocol

import asyncpg
import msgspec

from commonos.loop.memory import MemoryJournal
from commonos.proto.errors import OperationalError
from commonos.proto.events import MessageAppended
from commonos.proto.messages import Message, message_text
from commonos.proto.text import escape_nul, unescape_nul_json


class SearchUnavailable(OperationalError):
    """Search cannot be served (no database configured, or it is unreachable)."""


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    session_id: uuid.UUID
    seq: int
    role: str
    text: str


class MessageSearch(Protocol):
    async def search(
        self, profile_id: str, query: str, limit: int = 5, exclude_session: uuid.UUID | None = None
    ) -> list[SearchHit]:
        """The profile's messages best matching `query` (web-search syntax), best first."""
        ...


def _text_of(content: Any) -> str:
    try:
        return message_text(msgspec.convert(content, Message))
    except msgspec.ValidationError:
        return str(content)


class PostgresMessageSearch:
    """Search the `messages` table. `ts_config` must match the one of its generated `search` column."""

    QUERY = """
        SELECT session_id, seq, role, content
        FROM messages, websearch_to_tsquery($4::regconfig, $2) AS q
        WHERE profile_id = $1 AND search @@ q AND ($5::uuid IS NULL OR session_id <> $5)
        ORDER BY ts_rank(search, q) DESC, session_id DESC, seq DESC
        LIMIT $3
    """

    #: The text-search configuration named in the generated `messages.search` column's expression.
    COLUMN_CONFIG = r"""
        SELECT substring(pg_get_expr(d.adbin, d.adrelid) FROM '''(\w+)''::regconfig')
        FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = to_regclass('messages') AND a.attname = 'search'
    """

    def __init__(self, pool: asyncpg.Pool, *, ts_config: str | None = None) -> None:
        self.pool = pool
        #: None: read it from the column's definition on first use (else 'english').
        self.ts_config = ts_config

    @classmethod
    async def connect(cls, dsn: str, *, ts_config: str | None = None) -> PostgresMessageSearch:
        from commonos.runtime.postgres import create_pool

        pool = await create_pool(dsn, min_size=0, max_size=2, server_settings={"default_transaction_read_only": "on"})
        return cls(pool, ts_config=ts_config)

    async def _config(self) -> str:
        if self.ts_config is None:
            found = await self.pool.fetchval(self.COLUMN_CONFIG)
            self.ts_config = str(found) if found else "english"
        return self.ts_config

    async def search(
        self, profile_id: str, query: str, limit: int = 5, exclude_session: uuid.UUID | None = None
    ) -> list[SearchHit]:
        try:
            config = await self._config()
            rows = await self.pool.fetch(self.QUERY, profile_id, escape_nul(query), limit, config, exclude_session)
        except (OSError, asyncpg.PostgresError) as exc:
            raise SearchUnavailable(f"message search failed: {exc}") from exc
        return [
            SearchHit(
                session_id=r["session_id"], seq=r["seq"], role=r["role"], text=_text_of(unescape_nul_json(r["content"]))
            )
            for r in rows
        ]

    async def close(self) -> None:
        await self.pool.close()


class MemoryMessageSearch:
    """Messages of a MemoryJournal containing every word of the query (case-insensitive)."""

    def __init__(self, journal: MemoryJournal) -> None:
        self.journal = journal

    async def search(
        self, profile_id: str, query: str, limit: int = 5, exclude_session: uuid.UUID | None = None
    ) -> list[SearchHit]:
        words = [w.lower() for w in re.findall(r"\w+", query)]
        hits: list[SearchHit] = []
        for e in reversed(self.journal.events):
            if isinstance(e, MessageAppended) and e.profile_id == profile_id and e.session_id != exclude_session:
                text = message_text(e.content)
                if words and all(w in text.lower() for w in words):
                    hits.append(SearchHit(session_id=e.session_id, seq=e.seq, role=e.role, text=text))
        return hits[:limit]


class NoSearch:
    """Used when no database is configured: the tool says search is unavailable."""

    async def search(
        self, profile_id: str, query: str, limit: int = 5, exclude_session: uuid.UUID | None = None
    ) -> list[SearchHit]:
        raise SearchUnavailable("message search needs a database (COS_DATABASE_URL)")

"""PostgreSQL for the pages: every read in a read-only transaction, as the person's database role.

    async with db.reader(who.user) as conn:
        rows = await conn.fetch("SELECT ... FROM sessions ...")

Two pools when COS_DATABASE_READ_URL names a streaming replica: the pages read the replica, and the primary
(COS_DATABASE_URL) is asked only for what must be current (read-your-writes): whether a chat message may continue
a session (the session may have been started a moment ago, by this person, and not be on the replica yet),
a session that the replica does not have yet (its page and live events fall back to the primary instead of a
404), the projections' positions on the Operations page, and the sign-outs (written and read on the primary).
The chat page's own turn comes from NATS as it runs (pages/chat.py), never from a table, so a lagging replica
does not hold it back. Without a read URL every read is on the primary, as one pool.

An operator reads with the console's own role (it sees everything). Anyone else reads after
`SET LOCAL ROLE <their pg_role>`, so PostgreSQL's row-level security (deploy/postgres/roles.sql: cos_analyst,
analyst_grants) decides which rows exist for them; the pages never filter by profile themselves. The console's
login role must be a member of those roles (`GRANT alice TO cos_console`); a role it cannot take is a 403.
A database that cannot answer (down, restarting, the connection lost) is DatabaseUnavailable: 503 with the
reason (app.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from fastapi import HTTPException, Request

from commonos.console.sign_outs import ACQUIRE_TIMEOUT_S, UNAVAILABLE, unavailable
from commonos.console.users import User, check_pg_role
from commonos.runtime.postgres import Conn, ReplicaLag, create_pool, replica_lag


class Database:
    def __init__(
        self, pool: asyncpg.Pool, statement_timeout_ms: int = 10_000, read_pool: asyncpg.Pool | None = None
    ) -> None:
        #: The primary's (COS_DATABASE_URL).
        self.pool = pool
        #: The replica's (COS_DATABASE_READ_URL), or None: the pages read the primary.
        self.read_pool = read_pool
        self.statement_timeout_ms = statement_timeout_ms

    @classmethod
    async def open(
        cls, dsn: str, *, read_dsn: str | None = None, max_size: int = 8, statement_timeout_ms: int = 10_000
    ) -> Database:
        pool = await create_pool(dsn, min_size=1, max_size=max_size)
        read_pool = None
        if read_dsn and read_dsn != dsn:
            # Connected on first use: a replica that is down makes the pages 503 (and /readyz says so), it does
            # not keep the console from starting.
            read_pool = await create_pool(read_dsn, min_size=0, max_size=max_size)
        return cls(pool, statement_timeout_ms, read_pool)

    @property
    def has_replica(self) -> bool:
        return self.read_pool is not None

    async def close(self) -> None:
        await self.pool.close()
        if self.read_pool is not None:
            await self.read_pool.close()

    async def replica_lag(self) -> ReplicaLag | None:
        """How far the replica is behind (None: there is none); DatabaseUnavailable when it does not answer."""
        if self.read_pool is None:
            return None
        try:
            async with self.read_pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                return await replica_lag(conn)
        except UNAVAILABLE as exc:
            raise unavailable(exc, "replica") from None

    @contextlib.asynccontextmanager
    async def reader(self, user: User, *, primary: bool = False) -> AsyncIterator[Conn]:
        """A connection inside a read-only transaction, as `user` may read: of the replica when there is one,
        unless `primary` (what must be current: see above)."""
        pool = self.pool if primary or self.read_pool is None else self.read_pool
        try:
            async with pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn, conn.transaction(readonly=True):
                await conn.execute(f"SET LOCAL statement_timeout = {int(self.statement_timeout_ms)}")
                role = user.db_role
                if role is not None:
                    check_pg_role(role)
                    try:
                        await conn.execute(f'SET LOCAL ROLE "{role}"')
                    except (asyncpg.InsufficientPrivilegeError, asyncpg.InvalidParameterValueError):
                        raise HTTPException(403, f"the console cannot read as database role {role!r}") from None
                yield conn
        except UNAVAILABLE as exc:
            raise unavailable(exc, "database" if pool is self.pool else "replica") from None


def get_db(request: Request) -> Database:
    """A page's dependency: `db: Annotated[Database, Depends(get_db)]`."""
    db: Database | None = request.app.state.db
    if db is None:
        raise HTTPException(503, "the console has no database (COS_DATABASE_URL)")
    return db

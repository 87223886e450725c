"""PostgreSQL for the pages: one pool; every read in a read-only transaction, as the person's database role.

    async with db.reader(who.user) as conn:
        rows = await conn.fetch("SELECT ... FROM sessions ...")

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
from commonos.runtime.postgres import Conn, create_pool


class Database:
    def __init__(self, pool: asyncpg.Pool, statement_timeout_ms: int = 10_000) -> None:
        self.pool = pool
        self.statement_timeout_ms = statement_timeout_ms

    @classmethod
    async def open(cls, dsn: str, *, max_size: int = 8, statement_timeout_ms: int = 10_000) -> Database:
        pool = await create_pool(dsn, min_size=1, max_size=max_size)
        return cls(pool, statement_timeout_ms)

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def reader(self, user: User) -> AsyncIterator[Conn]:
        """A connection inside a read-only transaction, as `user` may read."""
        try:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn, conn.transaction(readonly=True):
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
            raise unavailable(exc) from None


def get_db(request: Request) -> Database:
    """A page's dependency: `db: Annotated[Database, Depends(get_db)]`."""
    db: Database | None = request.app.state.db
    if db is None:
        raise HTTPException(503, "the console has no database (COS_DATABASE_URL)")
    return db

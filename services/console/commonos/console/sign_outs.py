"""Sign-ins ended before their cookie expires: a sign-out is written down, so that a copy of the cookie taken
before it is refused, by every console of the database.

The session cookie is signed, not stored: it is valid until it expires unless something says otherwise. That
something is the table `console_sign_outs` (one row a sign-out: the sign-in's random id and when its cookie
would have expired anyway, after which the row is deleted). Every request that carries a valid cookie asks it
once (a primary-key look-up); the consoles of one database, sharing COS_CONSOLE_SECRET, share it. A console
without a database keeps its sign-outs in memory.

The console applies SCHEMA when it starts (`CREATE … IF NOT EXISTS`, like every service's): its database role
needs CREATE on schema public (deploy/postgres/bootstrap.sql) and owns the table (roles.sql).
"""

from __future__ import annotations

import time
from typing import Final, Protocol

import asyncpg

from commonos.proto.errors import OperationalError

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS console_sign_outs (
    sid        text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sign_outs_expires_at ON console_sign_outs (expires_at);
"""

#: What asyncpg raises when the database cannot answer now (down, restarting, the connection lost).
UNAVAILABLE: Final = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.ConnectionDoesNotExistError,
    # A pooled connection the server closed under it can be found mid-protocol ("another operation is in
    # progress") instead of closed.
    asyncpg.InternalClientError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    TimeoutError,
)


#: The longest a request waits for a connection of the pool before it is a 503.
ACQUIRE_TIMEOUT_S: Final = 5.0


class DatabaseUnavailable(OperationalError):
    """The database cannot be asked now: pages answer 503 with this reason."""


def unavailable(exc: BaseException, which: str = "database") -> DatabaseUnavailable:
    """`which`: "database" (COS_DATABASE_URL) or "replica" (COS_DATABASE_READ_URL)."""
    return DatabaseUnavailable(f"the console's {which} is unavailable: {str(exc) or type(exc).__name__}")


class SignOuts(Protocol):
    async def add(self, sid: str, expires_at: float) -> None: ...

    async def ended(self, sid: str) -> bool: ...


class MemorySignOuts:
    """A console without a database: its own sign-outs, forgotten when it stops (as are its sign-ins, whose
    key is random then, unless COS_CONSOLE_SECRET is set)."""

    def __init__(self) -> None:
        self._ended: dict[str, float] = {}

    async def add(self, sid: str, expires_at: float) -> None:
        now = time.time()
        for old in [s for s, until in self._ended.items() if until < now]:
            del self._ended[old]
        self._ended[sid] = expires_at

    async def ended(self, sid: str) -> bool:
        return sid in self._ended


class PgSignOuts:
    """The sign-outs of every console of the database."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def add(self, sid: str, expires_at: float) -> None:
        try:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn, conn.transaction():
                await conn.execute("DELETE FROM console_sign_outs WHERE expires_at < now()")
                await conn.execute(
                    "INSERT INTO console_sign_outs (sid, expires_at) VALUES ($1, to_timestamp($2)) "
                    "ON CONFLICT (sid) DO NOTHING",
                    sid,
                    expires_at,
                )
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None

    async def ended(self, sid: str) -> bool:
        try:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                found = await conn.fetchval("SELECT true FROM console_sign_outs WHERE sid = $1", sid)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return bool(found)

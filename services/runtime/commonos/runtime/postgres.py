"""PostgreSQL connections and schema application.

There is no migrate step: on every start each service applies its schema statements — core first,
then each plugin's — all `CREATE … IF NOT EXISTS`, under one advisory lock so that two processes
starting together do not race.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from commonos.proto.errors import ConfigError

#: A connection of its own or one borrowed from a pool.
Conn = asyncpg.Connection | PoolConnectionProxy

#: Key of the advisory lock taken while any schema is applied ("cosschem"), and while a partition is made.
SCHEMA_LOCK_KEY: Final = 0x636F737363686D
#: The SQLSTATE a schema raises for a table left in an older layout (ours: class CS is no PostgreSQL class).
OLD_LAYOUT_SQLSTATE: Final = "CS001"


class OldLayout(ConfigError):
    """A table the schema partitions exists unpartitioned (made by an older version): the message says how to
    move it. Waiting does not help: the service does not start."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(typename, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    conn: asyncpg.Connection = await asyncpg.connect(dsn, **kwargs)
    await _init_connection(conn)
    return conn


async def _keep_session(conn: asyncpg.Connection) -> None:
    """No reset on release: the services keep no session state (no LISTEN, cursors or advisory locks
    held across a release), and the default reset costs two round trips per batch."""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any) -> asyncpg.Pool:
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session, **kwargs
    )
    return pool


async def apply_schemas(conn: asyncpg.Connection, schemas: Sequence[str]) -> None:
    """Apply each schema script in order under the schema advisory lock."""
    await conn.execute("SELECT pg_advisory_lock($1)", SCHEMA_LOCK_KEY)
    try:
        for script in schemas:
            try:
                await conn.execute(script)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == OLD_LAYOUT_SQLSTATE:
                    raise OldLayout(str(exc)) from None
                raise
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", SCHEMA_LOCK_KEY)

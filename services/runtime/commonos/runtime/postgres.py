"""PostgreSQL connections and schema application.

There is no migrate step: on every start each service applies its schema statements — core first,
then each plugin's — all `CREATE … IF NOT EXISTS`, under one advisory lock so that two processes
starting together do not race.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


#: One look at a standby's replay. The seconds are those since the last transaction it replayed was committed on
#: the primary, and 0 when it has replayed all it received: an idle primary commits nothing, and a standby that
#: is up to date is not behind however old its last transaction is. Unknown (NULL) while it receives nothing
#: (no WAL receiver: the primary is gone, or it has not connected yet).
REPLICA_LAG_QUERY: Final = """
    SELECT pg_is_in_recovery() AS standby,
           pg_is_in_recovery() AND pg_is_wal_replay_paused() AS paused,
           CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() IS NULL THEN NULL
                WHEN pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() THEN 0.0
                ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 END AS seconds,
           CASE WHEN NOT pg_is_in_recovery() THEN NULL
                ELSE greatest(0, pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()))::bigint
           END AS bytes
"""


@dataclass(frozen=True)
class ReplicaLag:
    """How far a streaming replica is behind its primary, as the replica says (`replica_lag`)."""

    #: False when the connection is not a standby (pg_is_in_recovery() is false): nothing to measure.
    standby: bool
    #: Seconds behind (0 once it has replayed all it received); None when unknown (nothing received yet).
    seconds: float | None
    #: WAL received but not yet replayed, in bytes; None when unknown.
    bytes: int | None
    #: Its replay is paused (pg_wal_replay_pause()).
    paused: bool = False

    def __str__(self) -> str:
        if not self.standby:
            return "not a standby (pg_is_in_recovery() is false)"
        seconds = "? s" if self.seconds is None else f"{self.seconds:.1f} s"
        size = "? bytes" if self.bytes is None else f"{self.bytes:,} bytes"
        return f"{seconds} behind ({size} received, not yet replayed){', replay paused' if self.paused else ''}"


async def replica_lag(conn: Conn) -> ReplicaLag:
    """The lag of the standby `conn` is connected to (any role may ask)."""
    row = await conn.fetchrow(REPLICA_LAG_QUERY)
    assert row is not None
    seconds = row["seconds"]
    return ReplicaLag(
        standby=bool(row["standby"]),
        seconds=None if seconds is None else max(0.0, float(seconds)),
        bytes=None if row["bytes"] is None else int(row["bytes"]),
        paused=bool(row["paused"]),
    )

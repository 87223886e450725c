"""The rollups of `model_calls`: the daily `model_call_days` and the per-session `session_costs`
(`billing.schema.MODEL_CALL_DAYS`, `SESSION_COSTS`), kept equal to its sums.

Every writer of `model_calls` keeps them in step in its own transaction: the consumer adds the rows its insert
really added (:func:`add_days`, a redelivered call adds nothing), a reprice moves the calls it changed
(`billing.reprice`), a replay empties all three and rebuilds them, retention subtracts the month it drops
(`Table.drops`), and a profile's deletion changes none (its calls stay, an accounting record). Each takes the
rows' locks in the same order: the days' rows, then the sessions', each in key order. A change made to
`model_calls` by hand (an operator's ``DELETE``) is followed by :func:`rebuild_days` over the days it touched
(``cos billing rebuild-days``), which computes the sessions of those days again too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Final

from commonos.billing.rows import ModelCallRow
from commonos.billing.schema import (
    ADD_CALL_DAYS,
    ADD_SESSION_COSTS,
    CLEAR_CALL_DAYS,
    CLEAR_SESSION_COSTS,
    MODEL_CALLS,
    REBUILD_CALL_DAYS,
    REBUILD_SESSION_COSTS,
    SESSIONS_OF_DAYS,
)
from commonos.runtime import partitions

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

__all__ = ["INSERT_MODEL_CALLS", "Rebuilt", "add_days", "insert_calls", "rebuild_days"]

#: One round trip per batch: the columns as arrays (`unnest`), derived from the table's declaration
#: (`billing.schema.MODEL_CALLS`); a call whose vendor request id is already stored under another event id is
#: not inserted, and the event ids inserted are returned.
INSERT_MODEL_CALLS: Final = MODEL_CALLS.insert_bulk()


async def add_days(conn: Conn, added: Sequence[ModelCallRow]) -> None:
    """Add these stored calls to their days and to their sessions (the rows an insert has just added).

    Last in a writer's transaction: its row locks on the days, then on the sessions, come after the budget
    step's advisory lock and spend rows, the order a reprice takes them in too (`billing.reprice`), so neither
    waits for the other in a cycle."""
    if added:
        times = [r.created_at for r in added]
        args = ([r.event_id for r in added], min(times), max(times))
        await conn.execute(ADD_CALL_DAYS, *args)
        await conn.execute(ADD_SESSION_COSTS, *args)


async def insert_calls(conn: Conn, rows: Sequence[ModelCallRow]) -> list[uuid.UUID]:
    """Insert priced rows and add the new ones to their days, in the caller's transaction (or in one of its own
    when there is none, after making the months of `model_calls` the rows fall in: within a transaction that is
    the caller's to do first, `partitions.ensure`); returns the event ids added (a row already stored adds
    nothing, to its day neither)."""
    if not conn.is_in_transaction():
        await partitions.ensure(conn, {MODEL_CALLS.name: [r.created_at for r in rows]})
        async with conn.transaction():
            return await insert_calls(conn, rows)
    records = await conn.fetch(INSERT_MODEL_CALLS, *MODEL_CALLS.bulk_args(rows))
    added: list[uuid.UUID] = [r["event_id"] for r in records]
    kept = set(added)
    await add_days(conn, [r for r in rows if r.event_id in kept])
    return added


@dataclass(frozen=True, slots=True)
class Rebuilt:
    first: date
    last: date
    #: Rows of those days before and after.
    before: int
    after: int
    #: Sessions computed again (those with a call on those days, or that had one), and those of them with calls.
    sessions: int = 0
    sessions_after: int = 0


async def rebuild_days(conn: Conn, first: date = date.min, last: date = date.max) -> Rebuilt:
    """Compute the days from `first` to `last` (UTC dates, inclusive) again from `model_calls`, and the sessions
    with a call on them (or that had one, by `session_costs`), in one transaction.

    The rollups are locked against writers meanwhile (readers go on), the days first as writers take them: the
    lock waits for a batch that has added calls to commit, and the rebuild then counts them; a batch that comes
    after waits for the rebuild and adds its calls to the rebuilt rows."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE model_call_days, session_costs IN EXCLUSIVE MODE")
        before = await conn.execute(CLEAR_CALL_DAYS, first, last)
        after = await conn.execute(REBUILD_CALL_DAYS, first, last)
        sessions = [r[0] for r in await conn.fetch(SESSIONS_OF_DAYS, first, last)]
        await conn.execute(CLEAR_SESSION_COSTS, sessions)
        rebuilt = await conn.execute(REBUILD_SESSION_COSTS, sessions)
    return Rebuilt(
        first, last, int(before.split()[-1]), int(after.split()[-1]), len(sessions), int(rebuilt.split()[-1])
    )

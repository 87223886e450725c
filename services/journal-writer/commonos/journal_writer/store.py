"""Runs a projection plan against PostgreSQL (inside the consumer's transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from commonos.journal_writer.projection import (
    BULK,
    BULK_MIN_ROWS,
    CHECKED,
    PROFILE_ENSURE,
    STATEMENTS,
    check_event,
    columns,
    plan_events,
    profiles_mentioned,
)
from commonos.journal_writer.schema import CORE_TABLES
from commonos.proto.events import Event
from commonos.runtime.errors import EventRejected
from commonos.runtime.postgres import Conn


class JournalProjection:
    """The core projection: events -> profiles, sessions, turns, messages, tool_calls, approvals."""

    position_table = "projection_positions"
    tables = CORE_TABLES

    def __init__(self, name: str = "journal-writer") -> None:
        self.name = name
        #: The earliest mention of each profile this process has written: most batches need no prepare step.
        self._ensured: dict[str, datetime] = {}

    async def after_commit(self, conn: Conn, events: Sequence[Event]) -> None:
        """Bring each profile's created_at to its earliest mention, when a batch mentions it earlier."""
        earlier = [(p, t) for p, t in profiles_mentioned(events) if p not in self._ensured or t < self._ensured[p]]
        if earlier:
            await conn.executemany(PROFILE_ENSURE, earlier)
            self._ensured.update(earlier)

    def check(self, event: Event) -> None:
        check_event(event)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        plan = plan_events(events)
        for statement, sql in STATEMENTS.items():
            rows = plan.rows[statement]
            if not rows:
                continue
            if statement in CHECKED:
                await _checked(conn, statement, rows)
                continue
            bulk = BULK.get(statement)
            if bulk is not None and len(rows) >= BULK_MIN_ROWS:
                await conn.execute(bulk, *columns(statement, rows))
            else:
                await conn.executemany(sql, rows)


async def _checked(conn: Conn, statement: str, rows: list[tuple[Any, ...]]) -> None:
    """Run an update whose rows must exist; EventRejected names the first missing one."""
    sql = CHECKED[statement]
    if statement == "turn_finish":
        missing = await conn.fetch(sql, *columns(statement, rows))
        if missing:
            raise EventRejected(f"turn_finished: turn {missing[0][0]} does not exist (not started, or rejected)")
        return
    for message_ids, session_id in rows:
        missing = await conn.fetch(sql, message_ids, session_id)
        if missing:
            raise EventRejected(
                f"message_deactivated: session {session_id} does not hold message "
                f"{', '.join(str(r[0]) for r in missing[:3])}"
            )

"""Runs a projection plan against PostgreSQL (inside the consumer's transaction)."""

from __future__ import annotations

from collections.abc import Sequence

from commonos.journal_writer.projection import (
    BULK,
    BULK_MIN_ROWS,
    PROFILE_ENSURE,
    STATEMENTS,
    check_event,
    columns,
    plan_events,
    profiles_mentioned,
)
from commonos.journal_writer.schema import CORE_TABLES
from commonos.proto.events import Event
from commonos.runtime.postgres import Conn


class JournalProjection:
    """The core projection: events -> profiles, sessions, turns, messages, tool_calls, approvals."""

    position_table = "projection_positions"
    tables = CORE_TABLES

    def __init__(self, name: str = "journal-writer") -> None:
        self.name = name

    async def prepare(self, conn: Conn, events: Sequence[Event]) -> None:
        mentioned = profiles_mentioned(events)
        if mentioned:
            await conn.executemany(PROFILE_ENSURE, mentioned)

    def check(self, event: Event) -> None:
        check_event(event)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        plan = plan_events(events)
        for statement, sql in STATEMENTS.items():
            rows = plan.rows[statement]
            if not rows:
                continue
            bulk = BULK.get(statement)
            if bulk is not None and len(rows) >= BULK_MIN_ROWS:
                await conn.execute(bulk, *columns(statement, rows))
            else:
                await conn.executemany(sql, rows)

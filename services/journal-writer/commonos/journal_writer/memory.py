"""The Memory plugin's projection (`memory_entries`), hosted by the journal-writer process.

A profile's memory changes come from any of its sessions and must be applied in stream order, so
this projection is never partitioned by session: one consumer, filtered on `memory_changed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from commonos.loop.memory_schema import memory_rows
from commonos.proto.events import Event, MemoryChanged, MemoryOp, SessionCreated
from commonos.proto.subjects import SESSIONS_CREATED_FILTER
from commonos.runtime.errors import EventRejected
from commonos.runtime.owners import SessionOwners, owners_schema
from commonos.runtime.postgres import Conn

MEMORY_TABLES: Final = ("memory_entries", "memory_changes_applied", "memory_session_owners")
#: Who owns each session memory changes name: a change from another profile is a profile_mismatch dead letter.
OWNERS_SCHEMA: Final = owners_schema("memory_session_owners")
_APPLIED: Final = "SELECT true FROM memory_changes_applied WHERE event_id = $1"


class MemoryProjection:
    position_table = "projection_positions"
    filter_subjects = ("cos.events.*.*.memory_changed", SESSIONS_CREATED_FILTER)
    partitioned = False
    tables = MEMORY_TABLES

    def __init__(self, name: str = "memory-writer") -> None:
        self.name = name
        self.owners = SessionOwners("memory_session_owners")

    def check(self, event: Event) -> None:
        return None

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        await self.owners.check(conn, [e for e in events if isinstance(e, (MemoryChanged, SessionCreated))])
        for event in events:
            statements = memory_rows(event)
            if not statements:
                continue
            assert isinstance(event, MemoryChanged)
            needs_entry = event.op in (MemoryOp.REPLACE, MemoryOp.REMOVE)
            if needs_entry and await conn.fetchval(_APPLIED, event.event_id):
                continue  # applied before (a replayed copy): changes nothing
            status = ""
            for index, statement in enumerate(statements):
                result = await conn.execute(statement.sql, *statement.args)
                if index == 0:
                    status = result
            if needs_entry and status.rsplit(" ", 1)[-1] == "0":
                raise EventRejected(
                    f"memory_changed {event.op.value}: no memory entry at position {event.position} "
                    f"of {event.profile_id}'s {event.target.value}"
                )

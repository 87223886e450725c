"""The Memory plugin's projection (`memory_entries`), hosted by the journal-writer process.

A profile's memory changes come from any of its sessions and must be applied in stream order, so
this projection is never partitioned by session: one consumer, filtered on `memory_changed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from commonos.loop.memory_schema import memory_rows
from commonos.proto.events import Event
from commonos.runtime.postgres import Conn

MEMORY_TABLES: Final = ("memory_entries", "memory_changes_applied")


class MemoryProjection:
    position_table = "projection_positions"
    filter_subjects = ("cos.events.*.*.memory_changed",)
    partitioned = False
    tables = MEMORY_TABLES

    def __init__(self, name: str = "memory-writer") -> None:
        self.name = name

    def check(self, event: Event) -> None:
        return None

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        for event in events:
            for statement in memory_rows(event):
                await conn.execute(statement.sql, *statement.args)

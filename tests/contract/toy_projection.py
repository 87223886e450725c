"""A toy projection with a table of its own, added the way every projection is: this one module (its table
declared once, its projection, its `REGISTRATION`), its `Case` in test_projections.py, and a registration
(here `registry.registered(...)` for a test's duration; a package names it under the `commonos.projections`
entry points). Nothing else: the contract suite, `cos up`'s schemas and `cos replay` pick it up.

It keeps one row per model call: which profile, session and model, and how much output.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import msgspec

from commonos.proto.events import Event, ModelCallCompleted, SessionCreated
from commonos.proto.subjects import MODEL_CALLS_FILTER, SESSIONS_CREATED_FILTER
from commonos.runtime.owners import SessionOwners, owners_table
from commonos.runtime.postgres import Conn
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tables import ANALYST, CONSOLE, JOURNAL_WRITER, Read, Table, by_profile, positions_table


class OutputRow(msgspec.Struct, frozen=True):
    event_id: uuid.UUID
    profile_id: str
    session_id: uuid.UUID
    model: str
    output_tokens: int
    created_at: datetime


OUTPUTS: Final = Table(
    "toy_outputs",
    OutputRow,
    key=("event_id",),
    owner=JOURNAL_WRITER,
    types={"output_tokens": "bigint"},
    details={"output_tokens": "CHECK (output_tokens >= 0)"},
    indexes={"toy_outputs_session": "(session_id)"},
    readers=(Read(CONSOLE), Read(ANALYST, by_profile())),
    partition_by="created_at",
)
OWNERS: Final = owners_table("toy_session_owners", JOURNAL_WRITER)
POSITIONS: Final = positions_table("toy_positions", JOURNAL_WRITER)
TABLES: Final = (OUTPUTS, OWNERS, POSITIONS)
INSERT: Final = OUTPUTS.insert_bulk()


class ToyProjection(Projection):
    position_table = POSITIONS.name
    filter_subjects = (MODEL_CALLS_FILTER, SESSIONS_CREATED_FILTER)
    tables = rebuilt(TABLES)

    def __init__(self, name: str = "toy-writer") -> None:
        self.name = name
        self.owners = SessionOwners(OWNERS.name)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        await self.owners.check(conn, [e for e in events if isinstance(e, (ModelCallCompleted, SessionCreated))])
        rows = [
            OutputRow(e.event_id, e.profile_id, e.session_id, e.model, e.output_tokens, e.occurred_at)
            for e in events
            if isinstance(e, ModelCallCompleted)
        ]
        if rows:
            await conn.execute(INSERT, *OUTPUTS.bulk_args(rows))


REGISTRATION: Final = Registration(
    "toy", "journal-writer", TABLES, make=lambda suffix: ToyProjection("toy-writer" + suffix)
)

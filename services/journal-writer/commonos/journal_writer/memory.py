"""The Memory plugin's projection (`memory_entries`), hosted by the journal-writer process.

A profile's memory changes come from any of its sessions and must be applied in stream order, so
this projection is never partitioned by session: one consumer, filtered on `memory_changed` (and the
`session_created`, `profile_deleted` and `profile_upserted` it keeps records of).

A profile's deletion deletes its entries at its place in the stream and is remembered in
`memory_profile_deletions` (`commonos.runtime.tombstones`): the profile's memory changes after it are
`profile_deleted` dead letters until a `profile_upserted` re-creates the profile, whose memory starts empty.

`memory_rows(event)` is pure: it turns one event into the statements that apply it, run in the projection's
transaction. They are idempotent — each is guarded by the event id recorded in `memory_changes_applied` — so a
redelivered event changes nothing, and they keep positions exactly as `commonos.loop.session_state.apply_memory_op`
does (add inserts and shifts the rest down, past the end appends; replace and remove need an existing position;
remove closes the gap). They are UPDATEs and DELETEs over positions and an INSERT at a computed one, which a
`Table`'s insert cannot say: they are written out, over the tables declared here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

import msgspec

from commonos.proto.events import Event, MemoryChanged, MemoryOp, MemoryTarget, ProfileDeleted, SessionCreated
from commonos.proto.subjects import PROFILES_FILTER, SESSIONS_CREATED_FILTER
from commonos.proto.text import escape_nul
from commonos.runtime.errors import EventRejected
from commonos.runtime.owners import SessionOwners, owners_table
from commonos.runtime.postgres import Conn
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tables import ANALYST, JOURNAL_WRITER, Read, Table, by_profile, one_of
from commonos.runtime.tombstones import ProfileTombstones, check_profile_event, tombstones_table

DELETIONS_TABLE: Final = "memory_profile_deletions"


class MemoryEntry(msgspec.Struct, frozen=True):
    profile_id: str
    target: str
    position: int
    content: str
    updated_at: datetime
    #: The last event that wrote this entry.
    event_id: uuid.UUID


class ChangeApplied(msgspec.Struct, frozen=True):
    event_id: uuid.UUID
    profile_id: str
    applied_at: datetime


ENTRIES: Final = Table(
    "memory_entries",
    MemoryEntry,
    key=("profile_id", "target", "position"),
    owner=JOURNAL_WRITER,
    details={"target": one_of("target", MemoryTarget), "position": "CHECK (position >= 0)"},
    # Deferred: shifting positions moves rows over each other inside one statement.
    primary_key=(
        "CONSTRAINT memory_entries_pkey PRIMARY KEY (profile_id, target, position) DEFERRABLE INITIALLY DEFERRED"
    ),
    readers=(Read(ANALYST, by_profile()),),
)
APPLIED: Final = Table(
    "memory_changes_applied",
    ChangeApplied,
    key=("event_id",),
    owner=JOURNAL_WRITER,
    details={"applied_at": "DEFAULT now()"},
)
#: Who owns each session memory changes name: a change from another profile is a profile_mismatch dead letter;
#: and which profiles are deleted.
OWNERS: Final = owners_table("memory_session_owners", JOURNAL_WRITER)
DELETIONS: Final = tombstones_table(DELETIONS_TABLE, JOURNAL_WRITER)
TABLES: Final = (ENTRIES, APPLIED, OWNERS, DELETIONS)
SCHEMA: Final = "\n".join(t.ddl() for t in TABLES)
MEMORY_TABLES: Final = tuple(t.name for t in TABLES)
_APPLIED: Final = "SELECT true FROM memory_changes_applied WHERE event_id = $1"


# --- the statements of a change ---------------------------------------------------------------------------


class Statement(NamedTuple):
    sql: str
    args: tuple[Any, ...]


_NOT_APPLIED: Final = "NOT EXISTS (SELECT 1 FROM memory_changes_applied WHERE event_id = $1)"

_SHIFT_DOWN: Final = f"""
UPDATE memory_entries SET position = position + 1
WHERE profile_id = $2 AND target = $3 AND position >= $4 AND {_NOT_APPLIED}
"""
_INSERT: Final = f"""
INSERT INTO memory_entries (profile_id, target, position, content, updated_at, event_id)
SELECT $2::text, $3::text,
       LEAST($4::integer, (SELECT count(*) FROM memory_entries WHERE profile_id = $2 AND target = $3)),
       $5::text, $6::timestamptz, $1::uuid
WHERE {_NOT_APPLIED}
"""
_REPLACE: Final = f"""
UPDATE memory_entries SET content = $5, updated_at = $6, event_id = $1
WHERE profile_id = $2 AND target = $3 AND position = $4 AND {_NOT_APPLIED}
"""
_DELETE: Final = f"""
DELETE FROM memory_entries
WHERE profile_id = $2 AND target = $3 AND position = $4 AND {_NOT_APPLIED}
"""
_CLOSE_GAP: Final = f"""
UPDATE memory_entries SET position = position - 1
WHERE profile_id = $2 AND target = $3 AND position > $4
  AND NOT EXISTS (SELECT 1 FROM memory_entries WHERE profile_id = $2 AND target = $3 AND position = $4)
  AND {_NOT_APPLIED}
"""
_MARK: Final = """
INSERT INTO memory_changes_applied (event_id, profile_id) VALUES ($1, $2) ON CONFLICT (event_id) DO NOTHING
"""
#: A profile's deletion: its entries, and the record of the changes applied to them.
_DELETE_PROFILE: Final = (
    "DELETE FROM memory_entries WHERE profile_id = $1",
    "DELETE FROM memory_changes_applied WHERE profile_id = $1",
)


def profile_deleted_rows(profile_id: str) -> list[Statement]:
    """The statements that delete a profile's memory (`profile_deleted`), in order."""
    return [Statement(sql, (profile_id,)) for sql in _DELETE_PROFILE]


def memory_rows(event: Event) -> list[Statement]:
    """The statements that apply `event` to `memory_entries`, in order; none for other event types.

    Run them in order inside one transaction (`await conn.execute(s.sql, *s.args)`).
    """
    if not isinstance(event, MemoryChanged):
        return []
    e: uuid.UUID = event.event_id
    where = (e, event.profile_id, event.target.value, event.position)
    content = escape_nul(event.content or "")  # stored as text PostgreSQL can hold (commonos.proto.text)
    mark = Statement(_MARK, (e, event.profile_id))
    match event.op:
        case MemoryOp.ADD:
            return [
                Statement(_SHIFT_DOWN, where),
                Statement(_INSERT, (*where, content, event.occurred_at)),
                mark,
            ]
        case MemoryOp.REPLACE:
            return [Statement(_REPLACE, (*where, content, event.occurred_at)), mark]
        case MemoryOp.REMOVE:
            return [Statement(_DELETE, where), Statement(_CLOSE_GAP, where), mark]


# --- the projection ---------------------------------------------------------------------------------------


class MemoryProjection(Projection):
    position_table = "projection_positions"
    filter_subjects = (
        "cos.events.*.*.memory_changed",
        SESSIONS_CREATED_FILTER,
        PROFILES_FILTER,
    )
    partitioned = False
    tables = rebuilt(TABLES)

    def __init__(self, name: str = "memory-writer") -> None:
        self.name = name
        self.owners = SessionOwners("memory_session_owners")
        self.deletions = ProfileTombstones(DELETIONS_TABLE)

    def check(self, event: Event) -> None:
        check_profile_event(event)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        # A deleted profile's memory changes are refused; its sessions are not recorded as anyone's.
        events = await self.deletions.screen(conn, events, refuse=(MemoryChanged,), skip=(SessionCreated,))
        await self.owners.check(conn, [e for e in events if isinstance(e, (MemoryChanged, SessionCreated))])
        for event in events:
            if isinstance(event, ProfileDeleted):
                for statement in profile_deleted_rows(event.profile_id):
                    await conn.execute(statement.sql, *statement.args)
                continue
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


#: The Memory plugin's projection as registered (`commonos.projections` in pyproject.toml): one instance only.
REGISTRATION: Final = Registration("memory", "journal-writer", TABLES, make=lambda _: MemoryProjection(), single=True)

"""Runs a projection plan against PostgreSQL (inside the consumer's transaction)."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from commonos.journal_writer import schema
from commonos.journal_writer.projection import (
    BULK,
    BULK_MIN_ROWS,
    CHECKED,
    PROFILE_ENSURE,
    SEQ_TAKEN,
    SESSION_EVENTS,
    STATEMENTS,
    Plan,
    check_event,
    columns,
    partition_times,
    plan_segments,
    profiles_mentioned,
)
from commonos.proto.events import Event, ProfileDeleted, SessionCreated, event_type
from commonos.runtime import partitions
from commonos.runtime.errors import EventRejected
from commonos.runtime.postgres import Conn
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tombstones import ProfileTombstones

#: Session owners remembered between batches (the rest are looked up in `sessions`).
_MAX_OWNERS: Final = 200_000


class JournalProjection(Projection):
    """The core projection: events -> profiles, sessions, turns, messages, tool_calls, approvals.

    A profile's deletion deletes its row (and by cascade everything of it) at its place in the stream and
    is remembered in `profile_deletions` (`commonos.runtime.tombstones`): the profile's session events after
    it are `profile_deleted` dead letters until a `profile_upserted` re-creates the profile.
    """

    position_table = "projection_positions"
    tables = rebuilt(schema.TABLES)

    def __init__(self, name: str = "journal-writer") -> None:
        self.name = name
        #: The earliest mention of each profile this process has written: most batches need no prepare step.
        self._ensured: dict[str, datetime] = {}
        #: Who owns a session (the profile that created it): committed, and staged by the batch in flight.
        self._owners: OrderedDict[uuid.UUID, str] = OrderedDict()
        self._staged: dict[uuid.UUID, str] = {}
        self.deletions = ProfileTombstones(schema.DELETIONS_TABLE)
        #: Profiles the batch in flight deleted: their sessions leave the owners cache once it commits.
        self._deleted: set[str] = set()

    async def prepare(self, conn: Conn, events: Sequence[Event]) -> None:
        """Make the monthly partitions the batch's turns, messages, tool calls and approvals fall in."""
        await partitions.ensure(conn, partition_times(events))

    async def after_commit(self, conn: Conn, events: Sequence[Event]) -> None:
        """Bring each profile's created_at to its earliest mention, when a batch mentions it earlier."""
        for event in events:
            if isinstance(event, ProfileDeleted):
                self._ensured.pop(event.profile_id, None)  # a re-created profile's row is a new row
        earlier = [(p, t) for p, t in profiles_mentioned(events) if p not in self._ensured or t < self._ensured[p]]
        if earlier:
            await conn.executemany(PROFILE_ENSURE, earlier)
            self._ensured.update(earlier)

    def check(self, event: Event) -> None:
        check_event(event)

    def committed(self) -> None:
        """The owners of the sessions created by the batch that just committed are now facts."""
        self._owners.update(self._staged)
        self._staged.clear()
        if self._deleted:
            for session in [s for s, p in self._owners.items() if p in self._deleted]:
                del self._owners[session]  # deleted with their profile
            self._deleted.clear()
        while len(self._owners) > _MAX_OWNERS:
            self._owners.popitem(last=False)

    def rolled_back(self) -> None:
        self._staged.clear()
        self._deleted.clear()

    async def check_owners(self, conn: Conn, events: Sequence[Event]) -> None:
        """Every core event must come from the profile that created its session (`profile_mismatch`)."""
        sessions = {e.session_id for e in events if isinstance(e, SESSION_EVENTS)}
        unknown = [s for s in sessions if s not in self._owners and s not in self._staged]
        known: dict[uuid.UUID, str] = {}
        if unknown:
            rows = await conn.fetch("SELECT id, profile_id FROM sessions WHERE id = ANY($1::uuid[])", unknown)
            known = {r["id"]: r["profile_id"] for r in rows}
        for event in events:
            if not isinstance(event, SESSION_EVENTS):
                continue
            session = event.session_id
            owner = self._staged.get(session) or self._owners.get(session) or known.get(session)
            if owner is None:
                if isinstance(event, SessionCreated):
                    self._staged[session] = event.profile_id
                continue  # a missing session is the foreign keys' to report
            if owner != event.profile_id:
                raise EventRejected(
                    f"{event_type(event)} of session {session} from profile {event.profile_id!r}: the session "
                    f"belongs to profile {owner!r}",
                    reason="profile_mismatch",
                )

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        self._staged.clear()
        events = await self.deletions.screen(conn, events, refuse=SESSION_EVENTS)
        await self.check_owners(conn, events)
        for plan in plan_segments(events):
            await _run(conn, plan)
        self._deleted.update(e.profile_id for e in events if isinstance(e, ProfileDeleted))


async def _run(conn: Conn, plan: Plan) -> None:
    """The statements of one plan, in their fixed order."""
    for statement, sql in STATEMENTS.items():
        rows = plan.rows[statement]
        if not rows:
            continue
        if statement in CHECKED:
            await _checked(conn, statement, rows)
            continue
        if statement == "message_insert":
            await _seq_free(conn, rows)
        bulk = BULK.get(statement)
        if bulk is not None and len(rows) >= BULK_MIN_ROWS:
            await conn.execute(bulk, *columns(statement, rows))
        else:
            await conn.executemany(sql, rows)


async def _seq_free(conn: Conn, rows: list[tuple[Any, ...]]) -> None:
    """One message a (session, seq): EventRejected names a message whose seq its session already holds, in
    the table or earlier in the batch (`SEQ_TAKEN`)."""
    seen: dict[tuple[uuid.UUID, int], uuid.UUID] = {}
    for row in rows:
        message, session, seq = row[0], row[1], row[4]
        holder = seen.setdefault((session, seq), message)
        if holder != message:
            raise EventRejected(f"message_appended: session {session} already holds message {holder} at seq {seq}")
    taken = await conn.fetchrow(SEQ_TAKEN, [r[0] for r in rows], [r[1] for r in rows], [r[4] for r in rows])
    if taken is not None:
        raise EventRejected(
            f"message_appended: session {taken['session_id']} already holds message {taken['holder']} "
            f"at seq {taken['seq']}"
        )


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


#: The core projection as registered (`commonos.projections` in pyproject.toml).
REGISTRATION: Final = Registration(
    "core", "journal-writer", schema.TABLES, make=lambda suffix: JournalProjection("journal-writer" + suffix)
)

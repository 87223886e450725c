"""Who owns a session, for projections that cannot read the core's `sessions` table.

A session belongs to the profile that created it. An event about a session that another profile
owns is refused (`profile_mismatch`): a profile must never change, or be billed for, another's work.
The core projection checks against `sessions`; a plugin projection (billing, memory) keeps an owners
table of its own, filled from the `session_created` events it also reads and, for a session it has
seen no `session_created` of (imported work), from the first event that names it. Every check runs
inside the batch's transaction, in stream order, so a replay decides exactly as the live consumer did.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from commonos.proto.events import Event, event_type
from commonos.runtime.errors import EventRejected
from commonos.runtime.tables import Table

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

PROFILE_MISMATCH: Final = "profile_mismatch"


class OwnerRow(msgspec.Struct, frozen=True):
    session_id: uuid.UUID
    profile_id: str


def owners_table(table: str, owner: str) -> Table:
    """The declaration of an owners table named `table`, owned by the database role `owner`."""
    return Table(table, OwnerRow, key=("session_id",), owner=owner)


def owners_schema(table: str) -> str:
    return owners_table(table, "").ddl()


def mismatch(event: Event, owner: str) -> EventRejected:
    return EventRejected(
        f"{event_type(event)} of session {event.session_id} from profile {event.profile_id!r}: "
        f"the session belongs to profile {owner!r}",
        reason=PROFILE_MISMATCH,
    )


class SessionOwners:
    """The owners table `table` (see `owners_schema`) and the check of a batch's events against it."""

    def __init__(self, table: str) -> None:
        self.table = table

    async def check(self, conn: Conn, events: Sequence[Event]) -> None:
        """Raise a `profile_mismatch` EventRejected for the first event whose session another profile owns;
        record the owners the batch establishes."""
        if not events:
            return
        ids = list({e.session_id for e in events})
        rows = await conn.fetch(f"SELECT session_id, profile_id FROM {self.table} WHERE session_id = ANY($1)", ids)
        known: dict[uuid.UUID, str] = {r["session_id"]: r["profile_id"] for r in rows}
        new: dict[uuid.UUID, str] = {}
        for event in events:
            owner = known.get(event.session_id)
            if owner is None:
                known[event.session_id] = new[event.session_id] = event.profile_id
            elif owner != event.profile_id:
                raise mismatch(event, owner)
        if new:
            await conn.executemany(
                f"INSERT INTO {self.table} (session_id, profile_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                list(new.items()),
            )

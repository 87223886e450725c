"""Deleted profiles, as each projection remembers them: `profile_deleted`, and a `profile_upserted` after it.

Deleting a profile deletes its rows, and the deletion must stick: an event of the profile that arrives
after it (a loop that did not know yet, an old event sent again) must not bring a row back. So every
projection that keeps rows of profiles also keeps a table of deletions (`tombstones_schema`), of its
own, as it keeps its own session owners (`commonos.runtime.owners`), and decides in stream order, inside
the batch's transaction: a replay of the stream decides exactly as the live consumer did.

* `profile_deleted` records the deletion (who, when, the event) and the projection drops the profile's
  rows at that point of the stream. A profile the projection holds nothing of is recorded all the
  same (a deletion is about the profile id: what arrives later must be refused). A deletion of a
  profile whose deletion holds already changes nothing (the first one stands), nor does the same
  deletion event seen again.
* While a deletion holds, the projection's own events of the profile are refused (`profile_deleted`
  dead letters); events it only reads for bookkeeping (a plugin's `session_created`) are left out.
* A `profile_upserted` after the deletion re-creates the profile, afresh: the deletion no longer holds
  (its record keeps `recreated_at`), events from then on are applied, and nothing from before the
  deletion comes back unless it is published again. A `profile_upserted` that occurred before the
  deletion (one delivered again, an old one sent again) re-creates nothing: while the deletion holds it
  is left out, as the profile's other events are refused, so that applying a stretch of the stream
  again changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Final

import msgspec

from commonos.proto.events import NO_SESSION, Event, ProfileDeleted, ProfileUpserted, event_type
from commonos.proto.text import escape_nul
from commonos.runtime.errors import DataError, EventRejected
from commonos.runtime.tables import Table

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

#: The dead letter's reason for an event of a deleted profile.
PROFILE_DELETED: Final = "profile_deleted"


class DeletionRow(msgspec.Struct, frozen=True):
    profile_id: str
    deleted_at: datetime
    deleted_by: str
    event_id: uuid.UUID
    #: When a profile_upserted re-created the profile after the deletion; None while the deletion holds.
    recreated_at: datetime | None


def tombstones_table(table: str, owner: str) -> Table:
    """The declaration of a deletions table named `table`, owned by the database role `owner`."""
    return Table(table, DeletionRow, key=("profile_id",), owner=owner)


def tombstones_schema(table: str) -> str:
    return tombstones_table(table, "").ddl()


class ProfileEventInvalid(DataError):
    """A `profile_deleted` that cannot be true (an `invariant` dead letter)."""


def check_profile_event(event: Event) -> None:
    """Raise `ProfileEventInvalid` for a `profile_deleted` about a session."""
    if isinstance(event, ProfileDeleted) and event.session_id != NO_SESSION:
        raise ProfileEventInvalid(f"profile_deleted belongs to no session: its session id must be {NO_SESSION}")


@dataclass(frozen=True)
class Tombstone:
    profile_id: str
    deleted_at: datetime
    #: As stored (escaped: `commonos.proto.text`).
    deleted_by: str
    event_id: uuid.UUID
    recreated_at: datetime | None = None

    @property
    def holds(self) -> bool:
        """The deletion is in force: the profile was not re-created since."""
        return self.recreated_at is None


def refusal(event: Event, tombstone: Tombstone) -> EventRejected:
    return EventRejected(
        f"{event_type(event)} of profile {event.profile_id!r}: the profile was deleted at "
        f"{tombstone.deleted_at.isoformat()} by {tombstone.deleted_by}",
        reason=PROFILE_DELETED,
    )


class ProfileTombstones:
    """The deletions table `table` (see `tombstones_schema`) and the screening of a batch against it."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._select = (
            f"SELECT profile_id, deleted_at, deleted_by, event_id, recreated_at FROM {table} "
            "WHERE profile_id = ANY($1::text[])"
        )
        # Writers partitioned by session share the table: a batch holds its profiles' lock (shared) from
        # its first statement to its commit, a deletion holds it alone, so that no batch writes a profile's
        # rows while its deletion commits (checked before it, written after it).
        key = f"hashtext('{table}:' || p)"
        self._lock_shared = f"SELECT count(pg_advisory_xact_lock_shared({key})) FROM unnest($1::text[]) AS p"
        self._lock = f"SELECT count(pg_advisory_xact_lock({key})) FROM unnest($1::text[]) AS p"
        self._upsert = (
            f"INSERT INTO {table} (profile_id, deleted_at, deleted_by, event_id, recreated_at) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (profile_id) DO UPDATE SET deleted_at = EXCLUDED.deleted_at, "
            "deleted_by = EXCLUDED.deleted_by, event_id = EXCLUDED.event_id, recreated_at = EXCLUDED.recreated_at"
        )

    async def screen(
        self,
        conn: Conn,
        events: Sequence[Event],
        *,
        refuse: tuple[type[Event], ...],
        skip: tuple[type[Event], ...] = (),
    ) -> list[Event]:
        """The events of a batch to apply, in stream order, with the batch's deletions and re-creations recorded.

        Raises a `profile_deleted` EventRejected for the first event of a `refuse` type whose profile's
        deletion holds (the consumer then applies the batch one event at a time to find each). Leaves out
        the events of a `skip` type of such a profile, its `profile_upserted` from before the deletion, and
        every `profile_deleted` that changes nothing; each `profile_deleted` kept is one the projection must
        apply (drop the profile's rows) at its place.
        """
        watched = (ProfileDeleted, ProfileUpserted, *refuse, *skip)
        profiles = sorted({e.profile_id for e in events if isinstance(e, watched)})
        if not profiles:
            return list(events)
        deleting = sorted({e.profile_id for e in events if isinstance(e, ProfileDeleted)})
        if deleting:
            await conn.fetchval(self._lock, deleting)
        await conn.fetchval(self._lock_shared, [p for p in profiles if p not in deleting])
        rows = await conn.fetch(self._select, profiles)
        state: dict[str, Tombstone] = {
            r["profile_id"]: Tombstone(
                r["profile_id"], r["deleted_at"], r["deleted_by"], r["event_id"], r["recreated_at"]
            )
            for r in rows
        }
        changed: dict[str, Tombstone] = {}
        kept: list[Event] = []
        for event in events:
            profile = event.profile_id
            tombstone = state.get(profile)
            if isinstance(event, ProfileDeleted):
                if tombstone is not None and (tombstone.holds or tombstone.event_id == event.event_id):
                    continue  # deleted already (the first deletion stands), or this very deletion again
                state[profile] = changed[profile] = Tombstone(
                    profile, event.occurred_at, escape_nul(event.deleted_by), event.event_id
                )
            elif isinstance(event, ProfileUpserted):
                if tombstone is not None and tombstone.holds:
                    if event.occurred_at <= tombstone.deleted_at:
                        continue  # from before the deletion: it re-creates nothing
                    state[profile] = changed[profile] = replace(tombstone, recreated_at=event.occurred_at)
            elif tombstone is not None and tombstone.holds:
                if isinstance(event, refuse):
                    raise refusal(event, tombstone)
                if isinstance(event, skip):
                    continue
            kept.append(event)
        if changed:
            await conn.executemany(
                self._upsert,
                [(t.profile_id, t.deleted_at, t.deleted_by, t.event_id, t.recreated_at) for t in changed.values()],
            )
        return kept

"""Whether a profile exists, was deleted or re-created, as the journal (the stream) says: the latest
`profile_upserted` and `profile_deleted` of the profile, and where they are in the journal.

A profile is deleted while its latest `profile_deleted` comes after its latest `profile_upserted`; a
`profile_upserted` after it re-creates the profile afresh: its sessions and memory from before the
deletion are gone for good (`ProfileStatus.deleted_position`). Pure: the readers (the loop's journal, the
importer) fetch the profile-level events and fold them here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC
from typing import NamedTuple

import msgspec

from commonos.proto.events import Event, ProfileDeleted, ProfileUpserted


class StoredEvent(NamedTuple):
    """An event with its place in the journal (a stream sequence) and who published it (`ce-source`)."""

    position: int
    event: Event
    source: str | None = None


class ProfileStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A profile as the journal knows it: its latest `profile_upserted` and `profile_deleted`, each with its place."""

    profile_id: str
    upserted: ProfileUpserted | None = None
    upserted_position: int = 0
    #: `ce-source` of the latest `profile_upserted`: who keeps the profile (`urn:commonos:loop`, the importer).
    upserted_source: str | None = None
    deletion: ProfileDeleted | None = None
    #: Where the latest deletion is (0: never deleted): what the profile had before it is gone, re-created or not.
    deleted_position: int = 0

    @property
    def known(self) -> bool:
        return self.upserted is not None or self.deletion is not None

    @property
    def deleted(self) -> ProfileDeleted | None:
        """The deletion in force: the latest `profile_deleted`, when no `profile_upserted` came after it."""
        if self.deletion is not None and self.deleted_position > self.upserted_position:
            return self.deletion
        return None


def fold_profiles(stored: Iterable[StoredEvent]) -> dict[str, ProfileStatus]:
    """The status of every profile these profile-level events name (any order; the latest position wins)."""
    out: dict[str, ProfileStatus] = {}
    for position, event, source in stored:
        status = out.get(event.profile_id) or ProfileStatus(profile_id=event.profile_id)
        if isinstance(event, ProfileUpserted) and position > status.upserted_position:
            status = msgspec.structs.replace(status, upserted=event, upserted_position=position, upserted_source=source)
        elif isinstance(event, ProfileDeleted) and position > status.deleted_position:
            status = msgspec.structs.replace(status, deletion=event, deleted_position=position)
        else:
            continue
        out[event.profile_id] = status
    return out


def deleted_when_by(deletion: ProfileDeleted) -> str:
    """`at 2026-12-01 10:00:00 UTC by cli:alice`."""
    return f"at {deletion.occurred_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC by {deletion.deleted_by}"


def describe_deletion(deletion: ProfileDeleted) -> str:
    """`profile 'demo' was deleted at 2026-12-01 10:00:00 UTC by cli:alice`."""
    return f"profile {deletion.profile_id!r} was deleted {deleted_when_by(deletion)}"

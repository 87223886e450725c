"""Whether a profile exists, was deleted or re-created, as the journal (the stream) says: the latest
`profile_upserted` and `profile_deleted` of the profile, and where they are in the journal.

A profile is deleted while its latest `profile_deleted` comes after its latest `profile_upserted`; a
`profile_upserted` after it re-creates the profile afresh: its sessions and memory from before the
deletion are gone for good (`ProfileStatus.deleted_position`). Deleting publishes `profile_deleted`
(`delete_profile`), for `cos profile delete` and the loop service's `cos.cmd.<profile>.delete` alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC
from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from commonos.proto.events import Event, ProfileDeleted, ProfileUpserted
from commonos.proto.tags import check_profile_id
from commonos.proto.text import NUL

if TYPE_CHECKING:
    from commonos.loop.journal import Journal

#: The longest `deleted_by` a deletion takes (the event's limit).
MAX_DELETED_BY: Final = 256


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


class ProfileAdminError(ValueError):
    """A profile that cannot be deleted (or re-created) as asked; the message says why, in one line."""


def check_deleted_by(deleted_by: str) -> str:
    if not deleted_by or len(deleted_by) > MAX_DELETED_BY:
        raise ProfileAdminError(f"who deletes must be 1 to {MAX_DELETED_BY} characters, got {len(deleted_by)}")
    if NUL in deleted_by:
        raise ProfileAdminError("who deletes contains U+0000 (NUL), which cannot be stored")
    return deleted_by


async def delete_profile(journal: Journal, profile_id: str, deleted_by: str) -> ProfileDeleted:
    """Publish the deletion of a profile the journal knows and that is not deleted (`ProfileAdminError` otherwise)."""
    try:
        check_profile_id(profile_id)
    except ValueError as exc:
        raise ProfileAdminError(str(exc)) from None
    check_deleted_by(deleted_by)
    status = await journal.profile_status(profile_id)
    if not status.known and not await journal.has_events(profile_id):
        raise ProfileAdminError(f"no profile {profile_id!r} in the event stream")
    if status.deleted is not None:
        raise ProfileAdminError(describe_deletion(status.deleted) + " already")
    return await journal.delete_profile(profile_id, deleted_by)


# -- `cos.cmd.<profile>.delete.<requester>`, answered by the loop service ---------------------------------------


class DeleteRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Delete the profile of the subject, with everything of it (`profile_deleted`). A JSON object (`{}`);
    who asks is the subject's last token, recorded as the deletion's `deleted_by`."""


class DeleteReply(msgspec.Struct, frozen=True, kw_only=True):
    """`ok` with the `profile_deleted` event's id and time, or not `ok` with a one-line `error`."""

    ok: bool
    event_id: uuid.UUID | None = None
    deleted_at: str | None = None
    error: str | None = None

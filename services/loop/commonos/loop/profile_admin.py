"""Deleting a profile: the checks of `cos profile delete` and of the loop service's
`cos.cmd.<profile>.delete.<requester>`, and that command's request and reply."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Final

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.events import ProfileDeleted
from commonos.proto.profiles import describe_deletion
from commonos.proto.tags import check_profile_id
from commonos.proto.text import NUL

if TYPE_CHECKING:
    from commonos.loop.journal import Journal

#: The longest `deleted_by` a deletion takes (the event's limit).
MAX_DELETED_BY: Final = 256


class ProfileAdminError(DataError):
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

"""NATS subjects: `cos.events.<profile_id>.<session_id>.<event_type>`."""

from __future__ import annotations

import re
import uuid
from typing import Final, NamedTuple

from commonos.proto.errors import DataError
from commonos.proto.events import EVENT_TYPE_NAMES, NO_SESSION, EventBase, event_type

EVENTS_STREAM: Final = "COS_EVENTS"
EVENTS_PREFIX: Final = "cos.events"
EVENTS_ALL: Final = "cos.events.>"
DLQ_STREAM: Final = "COS_DLQ"
DLQ_PREFIX: Final = "cos.dlq"
DLQ_ALL: Final = "cos.dlq.>"
ALERTS_STREAM: Final = "COS_ALERTS"
ALERTS_ALL: Final = "cos.alerts.>"
ALERTS_BUDGET: Final = "cos.alerts.budget"
#: Billing's priced calls (`commonos.proto.costs`): `cos.costs.<profile_id>.priced`.
COSTS_STREAM: Final = "COS_COSTS"
COSTS_ALL: Final = "cos.costs.>"


def costs_subject(profile_id: str) -> str:
    """The subject of a profile's priced calls (a profile id is one subject token)."""
    return f"cos.costs.{profile_id}.priced"


MODEL_CALLS_FILTER: Final = "cos.events.*.*.model_call_completed"
#: Every session's creation: plugin projections learn from it which profile owns a session.
SESSIONS_CREATED_FILTER: Final = "cos.events.*.*.session_created"
#: Every profile's deletions and (re-)creations: each projection keeps its own record of deleted profiles.
PROFILES_DELETED_FILTER: Final = "cos.events.*.*.profile_deleted"
PROFILES_UPSERTED_FILTER: Final = "cos.events.*.*.profile_upserted"
#: Both at once: the profile-level events are the ones under the session token NO_SESSION.
PROFILES_FILTER: Final = f"cos.events.*.{NO_SESSION}.*"

_PROFILE_TOKEN = re.compile(r"[a-z0-9_-]{1,64}")


class SubjectError(DataError):
    """A subject that is not `cos.events.<profile>.<session>.<type>`."""


class EventSubject(NamedTuple):
    profile_id: str
    session_id: uuid.UUID
    event_type: str


def event_subject(profile_id: str, session_id: uuid.UUID, type_name: str) -> str:
    if not _PROFILE_TOKEN.fullmatch(profile_id):
        raise SubjectError(f"profile id {profile_id!r} is not a valid subject token")
    if type_name not in EVENT_TYPE_NAMES:
        raise SubjectError(f"unknown event type {type_name!r}")
    return f"{EVENTS_PREFIX}.{profile_id}.{session_id}.{type_name}"


def subject_for(event: EventBase) -> str:
    return event_subject(event.profile_id, event.session_id, event_type(event))


def profile_events_filter(profile_id: str = "*") -> str:
    """The profile-level events (`profile_upserted`, `profile_deleted`) of one profile, or of every profile."""
    if profile_id != "*" and not _PROFILE_TOKEN.fullmatch(profile_id):
        raise SubjectError(f"profile id {profile_id!r} is not a valid subject token")
    return f"{EVENTS_PREFIX}.{profile_id}.{NO_SESSION}.*"


def session_filter(profile_id: str, session_id: uuid.UUID) -> str:
    """Every event of one session (how the loop reads a session's history back)."""
    return f"{EVENTS_PREFIX}.{profile_id}.{session_id}.*"


def parse_subject(subject: str) -> EventSubject:
    parts = subject.split(".")
    if len(parts) != 5 or parts[0] != "cos" or parts[1] != "events":
        raise SubjectError(f"{subject!r} is not cos.events.<profile>.<session>.<type>")
    _, _, profile_id, session, type_name = parts
    if not _PROFILE_TOKEN.fullmatch(profile_id):
        raise SubjectError(f"{subject!r}: bad profile token {profile_id!r}")
    try:
        session_id = uuid.UUID(session)
    except ValueError:
        raise SubjectError(f"{subject!r}: session token {session!r} is not a UUID") from None
    if type_name not in EVENT_TYPE_NAMES:
        raise SubjectError(f"{subject!r}: unknown event type {type_name!r}")
    return EventSubject(profile_id, session_id, type_name)


def dlq_subject(original_subject: str) -> str:
    """Dead letters keep the original subject's tail, so they can be filtered the same way."""
    if original_subject.startswith(EVENTS_PREFIX + "."):
        return DLQ_PREFIX + original_subject[len(EVENTS_PREFIX) :]
    return f"{DLQ_PREFIX}.unrouted"

"""What every OTLP source module shares: who sent a request, what it mapped to, the ids (pure: no I/O).

Every event id is deterministic (derived from the source's own identifiers), so an exporter's retry of
a request publishes the same ids again, and JetStream and the consumers drop them as duplicates.

Ids shared by every vendor module (`Emitter`). *scope* is ``vendor_scope(vendor, profile)``
(`commonos.proto.graph.ids`): the token's profile is part of every id minted from the vendor's
identifiers, which its sender chose. So two profiles sending the same ``session.id`` or request id never
meet: neither's records are taken for duplicates of the other's, nor dead-lettered against a session the
other owns. Only the vendor's default profile (``claude-code``, ``codex``) keeps the ids minted before
(*scope* = the vendor's name); any other is ``<vendor>@<profile>``. The importer mints the same for a
transcript imported into that profile, so OTLP and import of one session still agree.

==========================  ==========================================================================
our id                      derived from
==========================  ==========================================================================
session id                  ``vendor_session_id(vendor, profile, vendor session id)`` =
                            ``mint_id("session", scope, vendor session id)``: the importer's root
                            session id of the same session's transcript imported into the profile
``session_created`` id      `gateway_id` ``("session_created", scope, vendor session id)``
turn id                     ``vendor_turn_id(scope, vendor session id, turn key)`` (=
                            `gateway_id` ``("turn", scope, vendor session id, turn key)``): for
                            Claude Code the importer's turn of the same prompt too
``turn_started`` id         `gateway_id` ``("turn_started", scope, vendor session id, turn key)``
``turn_finished`` id        `gateway_id` ``("turn_finished", scope, vendor session id, turn key)``: the
                            end the sweeper decides (:mod:`~commonos.otlp_gateway.turns`)
tool call id (ours)         `gateway_id` ``("tool_call", scope, vendor session id, call id)``
``tool_call_recorded`` id   `gateway_id` ``("tool_call_recorded", scope, vendor session id, call id)``
``approval_decided`` id     `gateway_id` ``("approval_decided", scope, vendor session id, call id)``
``model_call_completed``    per vendor (with *scope* too): see its module
==========================  ==========================================================================

A session and a turn are announced (``session_created``, ``turn_started``) in every request that has a
record of theirs, before the first event that needs them: the journal-writer needs a tool call's turn
and a turn's session, and inserts each with ``ON CONFLICT (id) DO NOTHING``, so the first announcement
stored wins and the others change nothing (JetStream drops those within its duplicate window). A record
whose event has the id of one already in the request (the same call or tool use twice) adds nothing: the
first is kept, the record counted ignored, so no request publishes an id twice.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import msgspec
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from commonos.otlp_gateway.attributes import attributes, from_nanos, resource_tags, text, timestamp
from commonos.otlp_gateway.turns import SessionTurns, TurnState, merge
from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    EventBase,
    SessionCreated,
    ToolCallRecorded,
    TurnStarted,
)
from commonos.proto.graph.ids import vendor_scope, vendor_session_id, vendor_turn_id
from commonos.proto.ids import GATEWAY_NAMESPACE, name_id
from commonos.proto.tags import tag_key


@dataclass(frozen=True)
class Source:
    """Who sent a request: the profile its bearer token belongs to, and how resource attributes become tags."""

    profile_id: str
    #: Bare resource attribute keys mapped to tags (`client=acme` -> `client:acme`); `cos.tag.<key>` always maps.
    tag_attributes: tuple[str, ...] = ("client", "project", "team")
    #: The token's own tags: every event carries them (`TokenInfo.tags`).
    tags: tuple[str, ...] = ()
    #: The tag keys the token's senders may set (`TokenInfo.tag_keys`); None: any.
    tag_keys: tuple[str, ...] | None = None

    def tags_of(self, resource: Mapping[str, Any]) -> tuple[tuple[str, ...], str | None]:
        """The tags of a resource's records, and what was left out (None: nothing), one line.

        The tags its attributes give (`resource_tags`: raises `InvalidTag` for an invalid one, which refuses
        the resource's records), less those the token may not give: a key of the token's own tags (the
        token's value wins) or, when the token names the keys its senders may set, any other key. Then the
        token's own tags. Left-out tags do not refuse the records: they are stored without them, and the
        line goes into the partial success's ``error_message``.
        """
        sent = resource_tags(resource, self.tag_attributes)
        if not self.tags and self.tag_keys is None:
            return sent, None
        fixed = {tag_key(t) for t in self.tags}
        kept: list[str] = []
        left_out: list[str] = []
        for tag in sent:
            key = tag_key(tag)
            allowed = key not in fixed and (self.tag_keys is None or key in self.tag_keys)
            (kept if allowed else left_out).append(tag)
        tags = tuple(sorted({*kept, *self.tags}))
        if not left_out:
            return tags, None
        may = "any other key" if self.tag_keys is None else (", ".join(self.tag_keys) or "no key")
        why = (
            f"tags this token may not give, left out: {', '.join(left_out)} (its own: {', '.join(self.tags) or 'none'};"
            f" its senders may set: {may})"
        )
        return tags, why


@dataclass
class Mapped:
    """The events of one request, in publishing order, and the records refused (with why)."""

    events: list[EventBase] = field(default_factory=list)
    #: Records (spans or log records) refused: the OTLP partial-success `rejected_*` count.
    rejected: int = 0
    #: Why records were refused, one line each (the partial-success `error_message` joins them).
    errors: list[str] = field(default_factory=list)
    #: Records accepted that map to no event (a source's other log events, spans of no GenAI operation).
    ignored: int = 0

    def reject(self, reason: str, records: int = 1) -> None:
        self.rejected += records
        if reason not in self.errors:
            self.errors.append(reason)

    def warn(self, reason: str) -> None:
        """Say `reason` in the partial success without refusing a record (OTLP's warning)."""
        if reason not in self.errors:
            self.errors.append(reason)

    def extend(self, other: Mapped) -> None:
        self.events.extend(other.events)
        self.rejected += other.rejected
        self.ignored += other.ignored
        for reason in other.errors:
            if reason not in self.errors:
                self.errors.append(reason)


class CallOrdinals(Protocol):
    """What the mapping keeps per session across requests (NATS KV in the gateway, memory in tests).

    ``ordinal`` returns the 0-based place of the record `fingerprint` identifies among the distinct ones
    seen under `session_key`: the same fingerprint always gets the same ordinal (an exporter's retry), a new
    one the next. Codex's calls use it to count calls of the very same usage (`codex.py`).

    ``turns_of`` returns what is known of a session's turns (None: nothing), and ``note_turns`` adds what a
    request saw of them (`turns.merge`, so that the order of requests and replicas does not matter); the
    sweeper ends them (:mod:`~commonos.otlp_gateway.turns`).
    """

    async def ordinal(self, vendor: str, session_key: str, fingerprint: str) -> int: ...

    async def turns_of(self, vendor: str, profile_id: str, session_key: str) -> SessionTurns | None: ...

    async def note_turns(self, seen: SessionTurns) -> None: ...


@runtime_checkable
class TurnStore(Protocol):
    """The sessions' turns as the sweeper reads and decides them: each session's state with a revision,
    replaced or deleted only if nobody wrote it since (compare-and-set)."""

    async def sessions(self) -> list[tuple[str, SessionTurns, int]]:
        """Every session's turns: (its key, its state, its revision)."""
        ...

    async def replace(self, key: str, state: SessionTurns, revision: int) -> int | None:
        """Store `state` if the session is still at `revision`: its new revision; None when another writer
        came first."""
        ...

    async def forget(self, key: str, revision: int) -> bool:
        """Delete the session's state if it is still at `revision`."""
        ...


def turns_key(vendor: str, profile_id: str, session_key: str) -> str:
    """The store's key of a session's turns: ``turns.`` and 32 hex of the SHA-256 of its scope and key."""
    digest = hashlib.sha256(msgspec.json.encode([vendor_scope(vendor, profile_id), session_key])).hexdigest()
    return f"turns.{digest[:32]}"


class MemoryOrdinals:
    """`CallOrdinals` and `TurnStore` in memory (tests, and replaying recorded payloads)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], dict[str, int]] = {}
        self._turns: dict[str, tuple[SessionTurns, int]] = {}
        self._revision = 0

    async def ordinal(self, vendor: str, session_key: str, fingerprint: str) -> int:
        seen = self._seen.setdefault((vendor, session_key), {})
        return seen.setdefault(fingerprint, len(seen))

    async def turns_of(self, vendor: str, profile_id: str, session_key: str) -> SessionTurns | None:
        stored = self._turns.get(turns_key(vendor, profile_id, session_key))
        return stored[0] if stored is not None else None

    async def note_turns(self, seen: SessionTurns) -> None:
        key = turns_key(seen.vendor, seen.profile_id, seen.session_key)
        stored = self._turns.get(key)
        self._revision += 1
        self._turns[key] = (merge(stored[0] if stored else None, seen), self._revision)

    async def sessions(self) -> list[tuple[str, SessionTurns, int]]:
        return [(key, state, revision) for key, (state, revision) in self._turns.items()]

    async def replace(self, key: str, state: SessionTurns, revision: int) -> int | None:
        stored = self._turns.get(key)
        if stored is None or stored[1] != revision:
            return None
        self._revision += 1
        self._turns[key] = (state, self._revision)
        return self._revision

    async def forget(self, key: str, revision: int) -> bool:
        stored = self._turns.get(key)
        if stored is None or stored[1] != revision:
            return False
        del self._turns[key]
        return True


# --- ids and the events every vendor shares -------------------------------------------------------


def gateway_id(*parts: str) -> uuid.UUID:
    """A deterministic event or row id: UUIDv5 of the JSON array of `parts` under the gateway's namespace."""
    return name_id(GATEWAY_NAMESPACE, *parts)


def session_id_of(vendor: str, profile_id: str, session_key: str) -> uuid.UUID:
    """Our id of a vendor session of `profile_id`: the importer's id of the same session's transcript tree
    imported into that profile (`vendor_session_id`)."""
    return uuid.UUID(vendor_session_id(vendor, profile_id, session_key))


def tool_call_id_of(vendor: str, session_key: str, call_id: str) -> uuid.UUID:
    return gateway_id("tool_call", vendor, session_key, call_id)


@dataclass(frozen=True)
class Record:
    """One log record, read: its event name, attributes and time (None when it states none)."""

    name: str
    attributes: dict[str, Any]
    time: datetime | None

    @staticmethod
    def of(record: LogRecord) -> Record:
        attrs = attributes(record.attributes)
        # The attribute first: Codex fills the record's event_name with its source location.
        name = text(attrs.get("event.name")) or record.event_name or ""
        # The record's own time: its `event.timestamp` (Codex leaves time_unix_nano 0), else the OTLP times.
        time = (
            timestamp(attrs.get("event.timestamp"))
            or from_nanos(record.time_unix_nano)
            or from_nanos(record.observed_time_unix_nano)
        )
        return Record(name, attrs, time)


@dataclass(frozen=True)
class CallAt:
    """Where a vendor's tool call record belongs: its vendor session, our session and turn, its call id, its time."""

    vendor: str
    session_key: str
    session_id: uuid.UUID
    turn_id: uuid.UUID
    call_id: str
    at: datetime


class Emitter:
    """The events of one request, with each session and turn announced once, before what needs it."""

    def __init__(self, source: Source, mapped: Mapped, received: float | None = None) -> None:
        self.source = source
        self.mapped = mapped
        #: When the request arrived (seconds since the epoch): its turns were last seen then.
        self.received = time.time() if received is None else received
        self._sessions: set[uuid.UUID] = set()
        self._turns: set[uuid.UUID] = set()
        self._events: set[uuid.UUID] = set()
        self._seen: dict[tuple[str, str], SessionTurns] = {}

    def saw(
        self, vendor: str, session_key: str, turn_key: str, tags: tuple[str, ...], at: datetime, *, prompt: bool
    ) -> None:
        """Note a record of the turn `turn_key` at `at` (its prompt's when `prompt`), for `turns_seen`."""
        turn = TurnState(key=turn_key, started=at, last=at, seen=self.received, prompted=prompt)
        seen = SessionTurns(
            vendor=vendor, profile_id=self.source.profile_id, session_key=session_key, tags=tags, turns=(turn,)
        )
        known = self._seen.get((vendor, session_key))
        self._seen[(vendor, session_key)] = seen if known is None else merge(known, seen)

    def turns_seen_of(self, vendor: str, session_key: str) -> SessionTurns | None:
        return self._seen.get((vendor, session_key))

    def turns_seen(self) -> list[SessionTurns]:
        """What this request saw of each session's turns, to add to the store (`CallOrdinals.note_turns`)."""
        return list(self._seen.values())

    def scope(self, vendor: str) -> str:
        """The vendor part of this request's ids: `vendor_scope` of the vendor and the token's profile."""
        return vendor_scope(vendor, self.source.profile_id)

    def add(self, event: EventBase) -> None:
        """Add `event`, unless the request already has one of its id (the same call's record twice): the
        first is kept, the record counted ignored."""
        if event.event_id in self._events:
            self.mapped.ignored += 1
            return
        self._events.add(event.event_id)
        self.mapped.events.append(event)

    def session(self, vendor: str, session_key: str, tags: tuple[str, ...], at: datetime) -> uuid.UUID:
        """The session's id, announcing it (``session_created``) if this request did not yet."""
        scope = self.scope(vendor)
        session_id = session_id_of(vendor, self.source.profile_id, session_key)
        if session_id not in self._sessions:
            self._sessions.add(session_id)
            self.add(
                SessionCreated(
                    event_id=gateway_id("session_created", scope, session_key),
                    occurred_at=at,
                    profile_id=self.source.profile_id,
                    session_id=session_id,
                    source=vendor,
                    tags=tags,
                )
            )
        return session_id

    def tool_call(
        self,
        at: CallAt,
        *,
        name: str,
        args: dict[str, Any],
        result: str | None,
        result_bytes: int | None = None,
        is_error: bool,
        started_at: datetime,
    ) -> ToolCallRecorded:
        """The ``tool_call_recorded`` of a vendor's tool call, with the ids of the module's table."""
        scope = self.scope(at.vendor)
        return ToolCallRecorded(
            event_id=gateway_id("tool_call_recorded", scope, at.session_key, at.call_id),
            occurred_at=at.at,
            profile_id=self.source.profile_id,
            session_id=at.session_id,
            turn_id=at.turn_id,
            tool_call_id=tool_call_id_of(scope, at.session_key, at.call_id),
            call_id=at.call_id,
            name=name,
            args=args,
            result=result,
            result_bytes=result_bytes,
            is_error=is_error,
            started_at=started_at,
            finished_at=at.at,
        )

    def approval(self, at: CallAt, *, approved: bool, decided_by: str) -> ApprovalDecided:
        """The ``approval_decided`` of a vendor's tool call (decided at `at`), with the ids of the module's table."""
        scope = self.scope(at.vendor)
        return ApprovalDecided(
            event_id=gateway_id("approval_decided", scope, at.session_key, at.call_id),
            occurred_at=at.at,
            profile_id=self.source.profile_id,
            session_id=at.session_id,
            turn_id=at.turn_id,
            tool_call_id=tool_call_id_of(scope, at.session_key, at.call_id),
            call_id=at.call_id,
            status=ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED,
            decided_at=at.at,
            decided_by=decided_by,
        )

    def turn(self, vendor: str, session_key: str, turn_key: str, tags: tuple[str, ...], at: datetime) -> uuid.UUID:
        """The turn's id, announcing its session and it (``turn_started``) if this request did not yet."""
        session_id = self.session(vendor, session_key, tags, at)
        scope = self.scope(vendor)
        turn_id = vendor_turn_id(scope, session_key, turn_key)
        if turn_id not in self._turns:
            self._turns.add(turn_id)
            self.add(
                TurnStarted(
                    event_id=gateway_id("turn_started", scope, session_key, turn_key),
                    occurred_at=at,
                    profile_id=self.source.profile_id,
                    session_id=session_id,
                    turn_id=turn_id,
                    tags=tags,
                )
            )
        return turn_id

"""Core tables of the specification (seed 003), applied on every start, `IF NOT EXISTS`.

Every row carries `profile_id`; deleting a profile deletes its sessions, turns, messages, tool calls
and approvals (a `profile_deleted` event deletes its row; `profile_deletions` remembers it).
`approvals.tool_call_id` has no foreign key: a decision is published before the tool runs, so the
approval may be projected before its tool call. Parent links (`parent_session_id`,
`parent_turn_id`) carry no foreign key either: writers partition the stream by session, so a child
session may be projected by another writer before its parent; the profile cascade still removes both.

The tables that grow without end, `turns`, `messages`, `tool_calls` and `approvals`, are partitioned by month
on their time (`Table.partition_by`, `commonos.runtime.partitions`): their primary keys are `(id, <time>)`, a
month is dropped whole (`cos retention`). A foreign key into a partitioned table must name its whole key, so
`turn_id` references no row (the writer applies a session's events in order: a turn's start before its
messages); `UNIQUE (session_id, seq)` and one approval per tool call, which a partitioned table cannot hold
across months, are kept by the writer (`journal_writer.projection`). `profiles` and `sessions` stay one table
each: every row references them, and the cascade of a profile's deletion goes through them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final

import msgspec

from commonos.runtime.tables import ANALYST, CONSOLE, JOURNAL_WRITER, LOOP, Read, Table, by_profile, positions_table
from commonos.runtime.tombstones import tombstones_table

#: The core's record of deleted profiles (`commonos.runtime.tombstones`).
DELETIONS_TABLE: Final = "profile_deletions"

_CASCADE: Final = "ON DELETE CASCADE"
_TO_PROFILE: Final = f"REFERENCES profiles (id) {_CASCADE}"
_TO_SESSION: Final = f"REFERENCES sessions (id) {_CASCADE}"
#: Every core table: the console reads all rows, an analyst those of the profiles granted to it.
_READERS: Final = (Read(CONSOLE), Read(ANALYST, by_profile()))


class ProfileRow(msgspec.Struct, frozen=True):
    id: str
    tags: tuple[str, ...]
    created_at: datetime
    #: Time of the latest profile_upserted; None for a profile only known from its sessions.
    updated_at: datetime | None


class SessionRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    profile_id: str
    source: str
    title: str | None
    tags: tuple[str, ...]
    parent_session_id: uuid.UUID | None
    context_snapshot: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


class TurnRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    profile_id: str
    parent_turn_id: uuid.UUID | None
    tags: tuple[str, ...]
    depth: int
    status: str
    error: str | None
    started_at: datetime
    finished_at: datetime | None


class MessageRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    turn_id: uuid.UUID | None
    profile_id: str
    seq: int
    role: str
    content: dict[str, Any]
    active: bool
    created_at: datetime


class ToolCallRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    turn_id: uuid.UUID
    session_id: uuid.UUID
    profile_id: str
    call_id: str
    name: str
    args: dict[str, Any]
    result: str | None
    is_error: bool
    risk: str
    approval: str | None
    started_at: datetime
    finished_at: datetime


class ApprovalRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    tool_call_id: uuid.UUID
    turn_id: uuid.UUID
    profile_id: str
    status: str
    decided_by: str
    decided_at: datetime


PROFILES: Final = Table(
    "profiles",
    ProfileRow,
    owner=JOURNAL_WRITER,
    details={"tags": "DEFAULT '{}'"},
    readers=(Read(CONSOLE), Read(ANALYST, by_profile("id"))),
)
SESSIONS: Final = Table(
    "sessions",
    SessionRow,
    owner=JOURNAL_WRITER,
    details={"profile_id": _TO_PROFILE, "tags": "DEFAULT '{}'"},
    indexes={
        "sessions_profile": "(profile_id, created_at)",
        # The console's session list: newest first, by keyset on (created_at, id).
        "sessions_created": "(created_at, id)",
        "sessions_parent": "(parent_session_id) WHERE parent_session_id IS NOT NULL",
    },
    readers=_READERS,
)
TURNS: Final = Table(
    "turns",
    TurnRow,
    owner=JOURNAL_WRITER,
    details={
        "session_id": _TO_SESSION,
        "profile_id": _TO_PROFILE,
        "tags": "DEFAULT '{}'",
        "depth": "DEFAULT 0 CHECK (depth >= 0)",
        "status": "DEFAULT 'running'",
    },
    indexes={
        "turns_session": "(session_id, started_at)",
        "turns_started": "(started_at DESC)",
        # The console's status filter: the sessions with a turn that did not complete (a few percent of them),
        # found without checking every session's latest turn. `completed` is left out: most sessions end so.
        "turns_not_completed": "(session_id) WHERE status <> 'completed'",
        # A turn is found by its id alone (turn_finished); the primary key's index leads with it too.
    },
    readers=_READERS,
    partition_by="started_at",
)
MESSAGES: Final = Table(
    "messages",
    MessageRow,
    owner=JOURNAL_WRITER,
    details={
        "session_id": _TO_SESSION,
        "profile_id": _TO_PROFILE,
        "seq": "CHECK (seq >= 1)",
        "active": "DEFAULT true",
    },
    extra=(
        "search tsvector GENERATED ALWAYS AS (\n"
        "        to_tsvector('english', coalesce(content ->> 'text', '') || ' ' || coalesce(content ->> 'content', ''))"
        "\n    ) STORED",
    ),
    indexes={
        # A session's conversation in order; one message a (session, seq), kept by the writer.
        "messages_session_seq": "(session_id, seq)",
        "messages_search": "USING gin (search)",
        "messages_profile": "(profile_id)",
    },
    # The loop searches every profile's messages (session_search).
    readers=(*_READERS, Read(LOOP, "true", policy="loop_reads_all")),
    partition_by="created_at",
)
TOOL_CALLS: Final = Table(
    "tool_calls",
    ToolCallRow,
    owner=JOURNAL_WRITER,
    details={
        "session_id": _TO_SESSION,
        "profile_id": _TO_PROFILE,
        "args": "DEFAULT '{}'",
        "is_error": "DEFAULT false",
    },
    indexes={"tool_calls_turn": "(turn_id)"},
    readers=_READERS,
    partition_by="started_at",
)
APPROVALS: Final = Table(
    "approvals",
    ApprovalRow,
    owner=JOURNAL_WRITER,
    details={"profile_id": _TO_PROFILE},
    # One approval a tool call, the first decision (its id derives from the tool call's): kept by the writer.
    indexes={"approvals_tool_call": "(tool_call_id)", "approvals_decided": "(decided_at DESC)"},
    readers=_READERS,
    partition_by="decided_at",
)
POSITIONS: Final = positions_table("projection_positions", JOURNAL_WRITER, (Read(CONSOLE),))
DELETIONS: Final = tombstones_table(DELETIONS_TABLE, JOURNAL_WRITER)

#: The core's tables, parents first (for creation, truncation and checksums).
TABLES: Final = (PROFILES, SESSIONS, TURNS, MESSAGES, TOOL_CALLS, APPROVALS, POSITIONS, DELETIONS)
SCHEMA: Final = "\n".join(t.ddl() for t in TABLES)

#: Core tables, parents first (for truncation and checksums).
CORE_TABLES: Final = ("profiles", "sessions", "turns", "messages", "tool_calls", "approvals")

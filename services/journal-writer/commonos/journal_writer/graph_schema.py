"""Tables of the session graph (seed 002) in their own PostgreSQL schema ``graph``.

Columns follow the graph's JSON field names. Every id is one of ours (a UUIDv5 from ``mint_id``), so a
row keeps its primary key when a grown transcript is imported again. Beside the primary key, each
table has the uniqueness constraint that matches the identity its id was minted from where that
identity is a set of columns (an input's ordinal in its session, the one result of a tool use, a
file touch's tool use, path and kind, an attribute's session, key, time and value, a vendor id's
type, vendor, kind and value); the rest are minted from vendor identifiers that live only in
``vendor_ids``, whose natural key is its primary key.

Every row belongs to a session and goes with it (``session_id`` references ``graph.sessions`` ON
DELETE CASCADE, nested sessions reference their parent the same way); the other references between
rows (input, invocation, parent invocation, tool use) are foreign keys too, so a part of a graph
that lacks a row it points at is rejected rather than stored half-linked. The one reference without
a foreign key is ``sessions.spawned_by_tool_use_id``: a nested session is inserted before the tool
uses of the graph, and ``validate`` has checked the link already.

A person's inputs and the assistant's text are searched by words: ``user_inputs.search`` and
``assistant_messages.search`` are generated tsvectors with GIN indexes, as the core's ``messages.search`` is.

Deleting a profile (``profile_deleted``) deletes the sessions its imports created (``profile_id``), and
with them every row of theirs; rows stored before ``profile_id`` existed carry none and stay.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final

import msgspec

from commonos.proto.graph.model import (
    SPEED_FAST,
    SPEED_STANDARD,
    SPEED_ULTRAFAST,
    USAGE_FIELDS,
    EntityType,
    InputKind,
    InputOrigin,
    Outcome,
    TokenBasis,
    ToolStatus,
    ToolVerb,
    TouchKind,
    UsageScope,
)
from commonos.runtime.tables import (
    ANALYST,
    CONSOLE,
    JOURNAL_WRITER,
    Read,
    Table,
    Upsert,
    by_profile,
    one_of,
    positions_table,
)
from commonos.runtime.tombstones import tombstones_table

#: The session graph's record of deleted profiles (`commonos.runtime.tombstones`).
DELETIONS_TABLE: Final = "graph.profile_deletions"

_TO_SESSION: Final = "REFERENCES graph.sessions (id) ON DELETE CASCADE"
_TO_INPUT: Final = "REFERENCES graph.user_inputs (id) ON DELETE CASCADE"
_TO_INVOCATION: Final = "REFERENCES graph.model_invocations (id) ON DELETE CASCADE"
_TO_TOOL_USE: Final = "REFERENCES graph.tool_uses (id) ON DELETE CASCADE"
_BASIS: Final = one_of("token_basis", TokenBasis)
_SPEED: Final = one_of("speed", (SPEED_STANDARD, SPEED_FAST, SPEED_ULTRAFAST))
#: graph.sessions is itself filtered for an analyst: a row of another table is visible when its session is.
_READERS: Final = (
    Read(CONSOLE),
    Read(ANALYST, "session_id IN (SELECT id FROM graph.sessions)", policy="analyst_by_session"),
)


#: What a re-import may complete in a stored session (graph_projection's docstring says why): a later end, and
#: with it the outcome; a null never replaces a value.
_SESSION_FILLED: Final = ("title", "working_dir", "git_branch", "repo_root", "worktree_root")
_SESSION_UPDATE: Final = Upsert(
    ("ended_at", "outcome", *_SESSION_FILLED),
    {c: f"coalesce(EXCLUDED.{c}, s.{c})" for c in _SESSION_FILLED},
    alias="s",
    where="coalesce(EXCLUDED.ended_at, '-infinity') >= coalesce(s.ended_at, '-infinity') "
    "AND (s.ended_at, s.outcome, s.title, s.working_dir, s.git_branch, s.repo_root, s.worktree_root) "
    "IS DISTINCT FROM (EXCLUDED.ended_at, EXCLUDED.outcome, coalesce(EXCLUDED.title, s.title), "
    "coalesce(EXCLUDED.working_dir, s.working_dir), coalesce(EXCLUDED.git_branch, s.git_branch), "
    "coalesce(EXCLUDED.repo_root, s.repo_root), coalesce(EXCLUDED.worktree_root, s.worktree_root))",
)
#: An input becomes interrupted when an interrupt follows it, never the other way.
_INPUT_UPDATE: Final = Upsert(
    ("interrupted",), {"interrupted": "true"}, alias="u", where="EXCLUDED.interrupted AND NOT u.interrupted"
)
#: A response's usage grows line by line: a larger total, or the first stop reason, replaces the counts.
_INVOCATION_UPDATE: Final = Upsert(
    USAGE_FIELDS,
    {"speed": "coalesce(EXCLUDED.speed, m.speed)", "stop_reason": "coalesce(EXCLUDED.stop_reason, m.stop_reason)"},
    alias="m",
    where="EXCLUDED.total_tokens > m.total_tokens "
    "OR (m.stop_reason IS NULL AND EXCLUDED.stop_reason IS NOT NULL AND EXCLUDED.total_tokens >= m.total_tokens)",
)
#: A use's status leaves no_result when its result arrives; its metadata comes from an import at least as complete.
_NEW_STATUS: Final = "CASE WHEN t.status = 'no_result' THEN EXCLUDED.status ELSE t.status END"
_TOOL_USE_UPDATE: Final = Upsert(
    ("status", "metadata"),
    {"status": _NEW_STATUS},
    alias="t",
    where=f"(EXCLUDED.status <> 'no_result' OR t.status = 'no_result') "
    f"AND (t.status, t.metadata) IS DISTINCT FROM ({_NEW_STATUS}, EXCLUDED.metadata)",
)


def _search(text: str) -> dict[str, str]:
    """A full-text `search` column of `text`, generated as `messages.search` is (the console's search reads it
    through its GIN index); added to tables made before it existed."""
    return {"search": f"tsvector GENERATED ALWAYS AS (to_tsvector('english', {text})) STORED"}


def _counts(*names: str) -> dict[str, str]:
    return {n: "bigint" for n in names}


def _non_negative(*names: str) -> dict[str, str]:
    return {n: f"CHECK ({n} >= 0)" for n in names}


class GraphSession(msgspec.Struct, frozen=True):
    id: uuid.UUID
    parent_session_id: uuid.UUID | None
    spawned_by_tool_use_id: uuid.UUID | None
    started_at: datetime | None
    ended_at: datetime | None
    title: str | None
    working_dir: str | None
    git_branch: str | None
    outcome: str
    repo_root: str | None
    worktree_root: str | None
    #: The profile whose import created the session (the transcript_imported event's profile): another
    #: profile's part naming it is refused. None on rows stored before the column existed.
    profile_id: str | None


class SessionAttribute(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    key: str
    value: Any
    valid_from: datetime


class UserInput(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    ordinal: int
    text: str
    triggered_at: datetime | None
    interrupted: bool
    kind: str
    origin: str
    metadata: Any


class ModelInvocation(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    user_input_id: uuid.UUID
    parent_model_invocation_id: uuid.UUID | None
    model: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int | None
    total_tokens: int
    token_basis: str | None
    speed: str | None
    stop_reason: str | None
    started_at: datetime | None
    #: The part of output_tokens that was reasoning; None when not reported (and on older rows).
    reasoning_tokens: int | None


class AssistantMessage(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    user_input_id: uuid.UUID
    model_invocation_id: uuid.UUID
    text: str | None
    content: Any | None
    timestamp: datetime | None


class ToolUse(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    user_input_id: uuid.UUID
    model_invocation_id: uuid.UUID
    name: str
    verb: str
    input: Any
    status: str
    metadata: Any
    timestamp: datetime | None


class ToolResult(msgspec.Struct, frozen=True):
    id: uuid.UUID
    tool_use_id: uuid.UUID
    session_id: uuid.UUID
    user_input_id: uuid.UUID
    status: str
    output_text: str | None
    output: Any | None
    error_text: str | None
    timestamp: datetime | None


class FileTouch(msgspec.Struct, frozen=True):
    id: uuid.UUID
    tool_use_id: uuid.UUID | None
    user_input_id: uuid.UUID
    session_id: uuid.UUID
    path: str
    kind: str
    start_line: int | None
    end_line: int | None
    hunks: Any | None


class TokenUsageRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    session_id: uuid.UUID
    user_input_id: uuid.UUID | None
    scope: str
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    total_tokens: int | None
    api_call_count: int | None
    token_basis: str | None
    speed: str | None


class VendorId(msgspec.Struct, frozen=True):
    our_type: str
    vendor: str
    vendor_id_kind: str
    vendor_id: str
    our_id: uuid.UUID
    session_id: uuid.UUID
    source_ref: str | None


#: The token counts of a model invocation (bigint, never negative: reasoning's own check says more).
_INVOCATION_TOKENS: Final = tuple(n for n in ModelInvocation.__struct_fields__ if n.endswith("_tokens"))
_USAGE_COUNTS: Final = (*(n for n in TokenUsageRow.__struct_fields__ if n.endswith("_tokens")), "api_call_count")


SESSIONS: Final = Table(
    "graph.sessions",
    GraphSession,
    owner=JOURNAL_WRITER,
    conflict=_SESSION_UPDATE,
    details={
        "parent_session_id": _TO_SESSION,
        "outcome": one_of("outcome", Outcome),
    },
    constraints=("CHECK ((parent_session_id IS NULL) = (spawned_by_tool_use_id IS NULL))",),
    added=("profile_id",),
    indexes={
        "sessions_profile": "(profile_id)",
        "sessions_parent": "(parent_session_id) WHERE parent_session_id IS NOT NULL",
        "sessions_started": "(started_at DESC)",
    },
    readers=(Read(CONSOLE), Read(ANALYST, by_profile())),
    # Retention keeps the months of the core tables for the graph too: a session that started before them
    # goes with its nested sessions and every row of theirs (the graph's ids are minted from identities,
    # not times, so its tables are not partitioned by month).
    expires_by="started_at",
)
SESSION_ATTRIBUTES: Final = Table(
    "graph.session_attributes",
    SessionAttribute,
    owner=JOURNAL_WRITER,
    details={"session_id": _TO_SESSION, "key": "CHECK (key <> '')"},
    # The value is hashed so that a long value cannot exceed a btree entry.
    indexes={"session_attributes_identity": "UNIQUE (session_id, key, valid_from, md5(value::text))"},
    readers=_READERS,
)
USER_INPUTS: Final = Table(
    "graph.user_inputs",
    UserInput,
    owner=JOURNAL_WRITER,
    conflict=_INPUT_UPDATE,
    details={
        "session_id": _TO_SESSION,
        "ordinal": "CHECK (ordinal >= 0)",
        "kind": one_of("kind", InputKind),
        "origin": one_of("origin", InputOrigin),
    },
    constraints=("UNIQUE (session_id, ordinal)",),
    added_extra=_search("text"),
    indexes={"user_inputs_search": "USING gin (search)"},
    readers=_READERS,
)
MODEL_INVOCATIONS: Final = Table(
    "graph.model_invocations",
    ModelInvocation,
    owner=JOURNAL_WRITER,
    conflict=_INVOCATION_UPDATE,
    types=_counts(*_INVOCATION_TOKENS),
    details={
        "session_id": _TO_SESSION,
        "user_input_id": _TO_INPUT,
        "parent_model_invocation_id": _TO_INVOCATION,
        **_non_negative(*_INVOCATION_TOKENS),
        "token_basis": _BASIS,
        "speed": _SPEED,
        "reasoning_tokens": "CHECK (reasoning_tokens >= 0 AND reasoning_tokens <= output_tokens)",
    },
    constraints=("CHECK (cache_write_1h_tokens <= cache_write_tokens)",),
    added=("reasoning_tokens",),
    indexes={
        "model_invocations_session": "(session_id, started_at)",
        "model_invocations_input": "(user_input_id)",
        "model_invocations_parent": "(parent_model_invocation_id) WHERE parent_model_invocation_id IS NOT NULL",
        "model_invocations_model": "(model, started_at)",
    },
    readers=_READERS,
)
ASSISTANT_MESSAGES: Final = Table(
    "graph.assistant_messages",
    AssistantMessage,
    owner=JOURNAL_WRITER,
    details={"session_id": _TO_SESSION, "user_input_id": _TO_INPUT, "model_invocation_id": _TO_INVOCATION},
    constraints=("CHECK (text IS NOT NULL OR content IS NOT NULL)",),
    added_extra=_search("coalesce(text, '')"),
    indexes={
        "assistant_messages_session": "(session_id)",
        "assistant_messages_search": "USING gin (search)",
        "assistant_messages_input": "(user_input_id)",
        "assistant_messages_invocation": "(model_invocation_id)",
    },
    readers=_READERS,
)
TOOL_USES: Final = Table(
    "graph.tool_uses",
    ToolUse,
    owner=JOURNAL_WRITER,
    conflict=_TOOL_USE_UPDATE,
    details={
        "session_id": _TO_SESSION,
        "user_input_id": _TO_INPUT,
        "model_invocation_id": _TO_INVOCATION,
        "verb": one_of("verb", ToolVerb),
        "status": one_of("status", ToolStatus),
    },
    indexes={
        "tool_uses_session": "(session_id)",
        "tool_uses_input": "(user_input_id)",
        "tool_uses_invocation": "(model_invocation_id)",
        "tool_uses_verb": "(verb, name)",
    },
    readers=_READERS,
)
TOOL_RESULTS: Final = Table(
    "graph.tool_results",
    ToolResult,
    owner=JOURNAL_WRITER,
    details={
        "tool_use_id": f"UNIQUE {_TO_TOOL_USE}",
        "session_id": _TO_SESSION,
        "user_input_id": _TO_INPUT,
        "status": one_of("status", (s for s in ToolStatus if s is not ToolStatus.NO_RESULT)),
    },
    indexes={"tool_results_session": "(session_id)", "tool_results_input": "(user_input_id)"},
    readers=_READERS,
)
FILE_TOUCHES: Final = Table(
    "graph.file_touches",
    FileTouch,
    owner=JOURNAL_WRITER,
    details={
        "tool_use_id": _TO_TOOL_USE,
        "user_input_id": _TO_INPUT,
        "session_id": _TO_SESSION,
        "path": "CHECK (path <> '')",
        "kind": one_of("kind", TouchKind),
        **_non_negative("start_line", "end_line"),
    },
    constraints=("UNIQUE (tool_use_id, path, kind)", "CHECK (end_line >= start_line)"),
    indexes={
        "file_touches_session": "(session_id)",
        "file_touches_input": "(user_input_id)",
        "file_touches_path": "(path)",
    },
    readers=_READERS,
)
TOKEN_USAGE: Final = Table(
    "graph.token_usage",
    TokenUsageRow,
    owner=JOURNAL_WRITER,
    types=_counts(*_USAGE_COUNTS),
    details={
        "session_id": _TO_SESSION,
        "user_input_id": _TO_INPUT,
        "scope": one_of("scope", UsageScope),
        **_non_negative(*_USAGE_COUNTS),
        "token_basis": _BASIS,
        "speed": _SPEED,
    },
    constraints=("CHECK (scope = 'session' OR user_input_id IS NOT NULL)",),
    indexes={
        "token_usage_session": "(session_id)",
        "token_usage_input": "(user_input_id) WHERE user_input_id IS NOT NULL",
    },
    readers=_READERS,
)
VENDOR_IDS: Final = Table(
    "graph.vendor_ids",
    VendorId,
    key=("our_type", "vendor", "vendor_id_kind", "vendor_id"),
    owner=JOURNAL_WRITER,
    details={
        "our_type": one_of("our_type", EntityType),
        "session_id": _TO_SESSION,
    },
    indexes={"vendor_ids_ours": "(our_id)", "vendor_ids_session": "(session_id)"},
    readers=_READERS,
)
#: Where the graph writer got to in the stream, written in the same transaction as its rows.
POSITIONS: Final = positions_table("graph.positions", JOURNAL_WRITER, (Read(CONSOLE),))
DELETIONS: Final = Table(
    DELETIONS_TABLE,
    tombstones_table(DELETIONS_TABLE, JOURNAL_WRITER).row,
    key=("profile_id",),
    owner=JOURNAL_WRITER,
    readers=(Read(CONSOLE),),
)

#: Graph tables, parents first (the order rows are inserted in, and the order for checksums).
ROW_TABLES: Final = (
    SESSIONS,
    SESSION_ATTRIBUTES,
    USER_INPUTS,
    MODEL_INVOCATIONS,
    ASSISTANT_MESSAGES,
    TOOL_USES,
    TOOL_RESULTS,
    FILE_TOUCHES,
    TOKEN_USAGE,
    VENDOR_IDS,
)
TABLES: Final = (*ROW_TABLES, POSITIONS, DELETIONS)
PRELUDE: Final = "CREATE SCHEMA IF NOT EXISTS graph;\n\n"
SCHEMA: Final = PRELUDE + "\n".join(t.ddl() for t in TABLES)
GRAPH_TABLES: Final = tuple(t.name for t in ROW_TABLES)

"""Core tables of the specification (seed 003), applied on every start, `IF NOT EXISTS`.

Every row carries `profile_id`; deleting a profile deletes its sessions, turns, messages, tool calls
and approvals (a `profile_deleted` event deletes its row; `profile_deletions` remembers it).
`approvals.tool_call_id` has no foreign key: a decision is published before the tool runs, so the
approval may be projected before its tool call. Parent links (`parent_session_id`,
`parent_turn_id`) carry no foreign key either: writers partition the stream by session, so a child
session may be projected by another writer before its parent; the profile cascade still removes both.
"""

from typing import Final

from commonos.runtime.tombstones import tombstones_schema

#: The core's record of deleted profiles (`commonos.runtime.tombstones`).
DELETIONS_TABLE: Final = "profile_deletions"

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS profiles (
    id          text PRIMARY KEY,
    tags        text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    -- Time of the latest profile_upserted; NULL for a profile only known from its sessions.
    updated_at  timestamptz
);

CREATE TABLE IF NOT EXISTS sessions (
    id                uuid PRIMARY KEY,
    profile_id        text NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    source            text NOT NULL,
    title             text,
    tags              text[] NOT NULL DEFAULT '{}',
    parent_session_id uuid,
    context_snapshot  jsonb,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_profile ON sessions (profile_id, created_at);
-- The console's session list: newest first, by keyset on (created_at, id).
CREATE INDEX IF NOT EXISTS sessions_created ON sessions (created_at, id);
CREATE INDEX IF NOT EXISTS sessions_parent ON sessions (parent_session_id)
    WHERE parent_session_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS turns (
    id             uuid PRIMARY KEY,
    session_id     uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    profile_id     text NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    parent_turn_id uuid,
    tags           text[] NOT NULL DEFAULT '{}',
    depth          integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
    status         text NOT NULL DEFAULT 'running',
    error          text,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz
);
CREATE INDEX IF NOT EXISTS turns_session ON turns (session_id, started_at);
CREATE INDEX IF NOT EXISTS turns_started ON turns (started_at DESC);

CREATE TABLE IF NOT EXISTS messages (
    id         uuid PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id    uuid REFERENCES turns (id) ON DELETE CASCADE,
    profile_id text NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    seq        integer NOT NULL CHECK (seq >= 1),
    role       text NOT NULL,
    content    jsonb NOT NULL,
    active     boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL,
    search     tsvector GENERATED ALWAYS AS (
        to_tsvector('english', coalesce(content ->> 'text', '') || ' ' || coalesce(content ->> 'content', ''))
    ) STORED,
    UNIQUE (session_id, seq)
);
CREATE INDEX IF NOT EXISTS messages_search ON messages USING gin (search);
CREATE INDEX IF NOT EXISTS messages_profile ON messages (profile_id);

CREATE TABLE IF NOT EXISTS tool_calls (
    id          uuid PRIMARY KEY,
    turn_id     uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    session_id  uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    profile_id  text NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    call_id     text NOT NULL,
    name        text NOT NULL,
    args        jsonb NOT NULL DEFAULT '{}',
    result      text,
    is_error    boolean NOT NULL DEFAULT false,
    risk        text NOT NULL,
    approval    text,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS tool_calls_turn ON tool_calls (turn_id);

CREATE TABLE IF NOT EXISTS approvals (
    id           uuid PRIMARY KEY,
    tool_call_id uuid NOT NULL UNIQUE,
    turn_id      uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    profile_id   text NOT NULL REFERENCES profiles (id) ON DELETE CASCADE,
    status       text NOT NULL,
    decided_by   text NOT NULL,
    decided_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_decided ON approvals (decided_at DESC);

-- Where each consumer of the stream got to, written in the same transaction as its rows.
CREATE TABLE IF NOT EXISTS projection_positions (
    consumer   text PRIMARY KEY,
    stream_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
""" + tombstones_schema(DELETIONS_TABLE)

#: Core tables, parents first (for truncation and checksums).
CORE_TABLES: Final = ("profiles", "sessions", "turns", "messages", "tool_calls", "approvals")

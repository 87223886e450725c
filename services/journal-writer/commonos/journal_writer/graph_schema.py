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

Deleting a profile (``profile_deleted``) deletes the sessions its imports created (``profile_id``), and
with them every row of theirs; rows stored before ``profile_id`` existed carry none and stay.
"""

from typing import Final

from commonos.runtime.tombstones import tombstones_schema

#: The session graph's record of deleted profiles (`commonos.runtime.tombstones`).
DELETIONS_TABLE: Final = "graph.profile_deletions"

SCHEMA: Final = """
CREATE SCHEMA IF NOT EXISTS graph;

CREATE TABLE IF NOT EXISTS graph.sessions (
    id                     uuid PRIMARY KEY,
    parent_session_id      uuid REFERENCES graph.sessions (id) ON DELETE CASCADE,
    spawned_by_tool_use_id uuid,
    started_at             timestamptz,
    ended_at               timestamptz,
    title                  text,
    working_dir            text,
    git_branch             text,
    outcome                text NOT NULL CHECK (outcome IN ('unknown', 'interrupted', 'committed', 'abandoned')),
    repo_root              text,
    worktree_root          text,
    CHECK ((parent_session_id IS NULL) = (spawned_by_tool_use_id IS NULL))
);
-- The profile whose import created the session (the transcript_imported event's profile): another profile's
-- part naming it is refused. Null on rows stored before the column existed.
ALTER TABLE graph.sessions ADD COLUMN IF NOT EXISTS profile_id text;
CREATE INDEX IF NOT EXISTS sessions_profile ON graph.sessions (profile_id);
CREATE INDEX IF NOT EXISTS sessions_parent ON graph.sessions (parent_session_id) WHERE parent_session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_started ON graph.sessions (started_at DESC);

CREATE TABLE IF NOT EXISTS graph.session_attributes (
    id         uuid PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    key        text NOT NULL CHECK (key <> ''),
    value      jsonb NOT NULL,
    valid_from timestamptz NOT NULL
);
-- The value is hashed so that a long value cannot exceed a btree entry.
CREATE UNIQUE INDEX IF NOT EXISTS session_attributes_identity
    ON graph.session_attributes (session_id, key, valid_from, md5(value::text));

CREATE TABLE IF NOT EXISTS graph.user_inputs (
    id           uuid PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    ordinal      integer NOT NULL CHECK (ordinal >= 0),
    text         text NOT NULL,
    triggered_at timestamptz,
    interrupted  boolean NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('prompt', 'slash_command', 'interrupt', 'other')),
    origin       text NOT NULL CHECK (origin IN ('human', 'agent', 'system', 'unknown')),
    metadata     jsonb NOT NULL,
    UNIQUE (session_id, ordinal)
);

CREATE TABLE IF NOT EXISTS graph.model_invocations (
    id                         uuid PRIMARY KEY,
    session_id                 uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    user_input_id              uuid NOT NULL REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    parent_model_invocation_id uuid REFERENCES graph.model_invocations (id) ON DELETE CASCADE,
    model                      text,
    input_tokens               bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens              bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens          bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens         bigint NOT NULL CHECK (cache_write_tokens >= 0),
    cache_write_1h_tokens      bigint CHECK (cache_write_1h_tokens >= 0),
    total_tokens               bigint NOT NULL CHECK (total_tokens >= 0),
    token_basis                text CHECK (token_basis IN ('tokens_reported', 'aggregate_reported', 'estimated',
                                                           'unknown')),
    speed                      text CHECK (speed IN ('standard', 'fast', 'ultrafast')),
    stop_reason                text,
    started_at                 timestamptz,
    CHECK (cache_write_1h_tokens <= cache_write_tokens)
);
-- The part of output_tokens that was reasoning; null when not reported, and on rows stored before the column
-- existed (a database made before it gains the column here).
ALTER TABLE graph.model_invocations ADD COLUMN IF NOT EXISTS reasoning_tokens bigint
    CHECK (reasoning_tokens >= 0 AND reasoning_tokens <= output_tokens);
CREATE INDEX IF NOT EXISTS model_invocations_session ON graph.model_invocations (session_id, started_at);
CREATE INDEX IF NOT EXISTS model_invocations_input ON graph.model_invocations (user_input_id);
CREATE INDEX IF NOT EXISTS model_invocations_parent ON graph.model_invocations (parent_model_invocation_id)
    WHERE parent_model_invocation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS model_invocations_model ON graph.model_invocations (model, started_at);

CREATE TABLE IF NOT EXISTS graph.assistant_messages (
    id                  uuid PRIMARY KEY,
    session_id          uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    user_input_id       uuid NOT NULL REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    model_invocation_id uuid NOT NULL REFERENCES graph.model_invocations (id) ON DELETE CASCADE,
    text                text,
    content             jsonb,
    "timestamp"         timestamptz,
    CHECK (text IS NOT NULL OR content IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS assistant_messages_session ON graph.assistant_messages (session_id);
CREATE INDEX IF NOT EXISTS assistant_messages_input ON graph.assistant_messages (user_input_id);
CREATE INDEX IF NOT EXISTS assistant_messages_invocation ON graph.assistant_messages (model_invocation_id);

CREATE TABLE IF NOT EXISTS graph.tool_uses (
    id                  uuid PRIMARY KEY,
    session_id          uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    user_input_id       uuid NOT NULL REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    model_invocation_id uuid NOT NULL REFERENCES graph.model_invocations (id) ON DELETE CASCADE,
    name                text NOT NULL,
    verb                text NOT NULL CHECK (verb IN ('read', 'edit', 'search', 'execute', 'spawn_subagent', 'other')),
    input               jsonb NOT NULL,
    status              text NOT NULL CHECK (status IN ('no_result', 'unknown', 'ok', 'error', 'interrupted')),
    metadata            jsonb NOT NULL,
    "timestamp"         timestamptz
);
CREATE INDEX IF NOT EXISTS tool_uses_session ON graph.tool_uses (session_id);
CREATE INDEX IF NOT EXISTS tool_uses_input ON graph.tool_uses (user_input_id);
CREATE INDEX IF NOT EXISTS tool_uses_invocation ON graph.tool_uses (model_invocation_id);
CREATE INDEX IF NOT EXISTS tool_uses_verb ON graph.tool_uses (verb, name);

CREATE TABLE IF NOT EXISTS graph.tool_results (
    id            uuid PRIMARY KEY,
    tool_use_id   uuid NOT NULL UNIQUE REFERENCES graph.tool_uses (id) ON DELETE CASCADE,
    session_id    uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    user_input_id uuid NOT NULL REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    status        text NOT NULL CHECK (status IN ('unknown', 'ok', 'error', 'interrupted')),
    output_text   text,
    output        jsonb,
    error_text    text,
    "timestamp"   timestamptz
);
CREATE INDEX IF NOT EXISTS tool_results_session ON graph.tool_results (session_id);
CREATE INDEX IF NOT EXISTS tool_results_input ON graph.tool_results (user_input_id);

CREATE TABLE IF NOT EXISTS graph.file_touches (
    id            uuid PRIMARY KEY,
    tool_use_id   uuid REFERENCES graph.tool_uses (id) ON DELETE CASCADE,
    user_input_id uuid NOT NULL REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    session_id    uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    path          text NOT NULL CHECK (path <> ''),
    kind          text NOT NULL CHECK (kind IN ('read', 'edit')),
    start_line    integer CHECK (start_line >= 0),
    end_line      integer CHECK (end_line >= 0),
    hunks         jsonb,
    UNIQUE (tool_use_id, path, kind),
    CHECK (end_line >= start_line)
);
CREATE INDEX IF NOT EXISTS file_touches_session ON graph.file_touches (session_id);
CREATE INDEX IF NOT EXISTS file_touches_input ON graph.file_touches (user_input_id);
CREATE INDEX IF NOT EXISTS file_touches_path ON graph.file_touches (path);

CREATE TABLE IF NOT EXISTS graph.token_usage (
    id                 uuid PRIMARY KEY,
    session_id         uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    user_input_id      uuid REFERENCES graph.user_inputs (id) ON DELETE CASCADE,
    scope              text NOT NULL CHECK (scope IN ('input', 'session')),
    model              text,
    input_tokens       bigint CHECK (input_tokens >= 0),
    output_tokens      bigint CHECK (output_tokens >= 0),
    cache_read_tokens  bigint CHECK (cache_read_tokens >= 0),
    cache_write_tokens bigint CHECK (cache_write_tokens >= 0),
    total_tokens       bigint CHECK (total_tokens >= 0),
    api_call_count     bigint CHECK (api_call_count >= 0),
    token_basis        text CHECK (token_basis IN ('tokens_reported', 'aggregate_reported', 'estimated', 'unknown')),
    speed              text CHECK (speed IN ('standard', 'fast', 'ultrafast')),
    CHECK (scope = 'session' OR user_input_id IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS token_usage_session ON graph.token_usage (session_id);
CREATE INDEX IF NOT EXISTS token_usage_input ON graph.token_usage (user_input_id) WHERE user_input_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS graph.vendor_ids (
    our_type       text NOT NULL CHECK (our_type IN ('session', 'user_input', 'model_invocation', 'assistant_message',
                                                     'tool_use', 'tool_result', 'file_touch', 'session_attribute',
                                                     'token_usage')),
    vendor         text NOT NULL,
    vendor_id_kind text NOT NULL,
    vendor_id      text NOT NULL,
    our_id         uuid NOT NULL,
    session_id     uuid NOT NULL REFERENCES graph.sessions (id) ON DELETE CASCADE,
    source_ref     text,
    PRIMARY KEY (our_type, vendor, vendor_id_kind, vendor_id)
);
CREATE INDEX IF NOT EXISTS vendor_ids_ours ON graph.vendor_ids (our_id);
CREATE INDEX IF NOT EXISTS vendor_ids_session ON graph.vendor_ids (session_id);

-- Where the graph writer got to in the stream, written in the same transaction as its rows.
CREATE TABLE IF NOT EXISTS graph.positions (
    consumer   text PRIMARY KEY,
    stream_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
""" + tombstones_schema(DELETIONS_TABLE)

#: Graph tables, parents first (the order rows are inserted in, and the order for checksums).
GRAPH_TABLES: Final = (
    "graph.sessions",
    "graph.session_attributes",
    "graph.user_inputs",
    "graph.model_invocations",
    "graph.assistant_messages",
    "graph.tool_uses",
    "graph.tool_results",
    "graph.file_touches",
    "graph.token_usage",
    "graph.vendor_ids",
)

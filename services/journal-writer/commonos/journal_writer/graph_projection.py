"""The graph writer: ``transcript_imported`` events -> the ``graph`` tables (see graph_schema).

An event carries a session graph (``self_contained``), or one of the consecutive parts of a graph
too large for one message, or the rows a watcher found new; such a part may refer to rows of
earlier parts or earlier imports of the same tree. The event is checked with ``validate`` before
anything is written, a part on its own rows (``partial``): a graph that breaks the session model
is dead-lettered. Its rows are then inserted parents first, every statement keyed on the row's id,
so applying an event twice, or an import of the same transcript, adds nothing. A part's reference
to a row that is not stored (an earlier part was lost) violates a foreign key, and the consumer
dead-letters the part; replaying the dead letters in order stores them.

Re-importing a transcript that has grown adds rows; the columns below are the only ones an import
may change in a stored row, each because the transcript legitimately completes them over time and
each only forward, so replaying an older import never undoes a newer one:

* ``sessions``: ``ended_at`` (only to a later time, or from null), and with it ``outcome``,
  ``title``, ``working_dir``, ``git_branch``, ``repo_root``, ``worktree_root`` (a null never
  replaces a value).
* ``user_inputs.interrupted``: false -> true, when an interrupt follows the input.
* ``model_invocations`` token counts, ``token_basis``, ``speed`` and ``stop_reason``: when the new
  ``total_tokens`` is larger or the stored row has no stop reason yet and the new one has. Claude
  Code writes a response one content block per line, each repeating the usage so far, so a read
  between two lines of one response sees a partial count.
* ``tool_uses.status``: ``no_result`` -> the status of its result, when the result arrives; and
  ``metadata`` (the subagent detail of a spawning call) from an import at least as complete.

Every other column is written once (``ON CONFLICT (id) DO NOTHING``). A row that collides with a
stored one on its natural key under a different id (say a second result for one tool use) violates
a unique constraint, and the consumer dead-letters the event.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec

from commonos.journal_writer.graph_schema import DELETIONS_TABLE, PRELUDE, TABLES
from commonos.proto.events import Event, ProfileDeleted, TranscriptImported
from commonos.proto.graph import Graph, GraphInvalid, decode_graph, validate
from commonos.proto.subjects import PROFILES_FILTER
from commonos.proto.text import escape_nul, escape_nul_in_json
from commonos.runtime.errors import DataError
from commonos.runtime.owners import mismatch
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tombstones import ProfileTombstones, check_profile_event

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

#: Statements in the order they run (parents first); each is idempotent.
STATEMENTS: Final[dict[str, str]] = {
    "sessions": """
        INSERT INTO graph.sessions AS s (id, parent_session_id, spawned_by_tool_use_id, started_at, ended_at, title,
                                         working_dir, git_branch, outcome, repo_root, worktree_root, profile_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
        ON CONFLICT (id) DO UPDATE SET
            ended_at = EXCLUDED.ended_at,
            outcome = EXCLUDED.outcome,
            title = coalesce(EXCLUDED.title, s.title),
            working_dir = coalesce(EXCLUDED.working_dir, s.working_dir),
            git_branch = coalesce(EXCLUDED.git_branch, s.git_branch),
            repo_root = coalesce(EXCLUDED.repo_root, s.repo_root),
            worktree_root = coalesce(EXCLUDED.worktree_root, s.worktree_root)
        WHERE coalesce(EXCLUDED.ended_at, '-infinity') >= coalesce(s.ended_at, '-infinity')
          AND (s.ended_at, s.outcome, s.title, s.working_dir, s.git_branch, s.repo_root, s.worktree_root)
              IS DISTINCT FROM
              (EXCLUDED.ended_at, EXCLUDED.outcome, coalesce(EXCLUDED.title, s.title),
               coalesce(EXCLUDED.working_dir, s.working_dir), coalesce(EXCLUDED.git_branch, s.git_branch),
               coalesce(EXCLUDED.repo_root, s.repo_root), coalesce(EXCLUDED.worktree_root, s.worktree_root))""",
    "session_attributes": """
        INSERT INTO graph.session_attributes (id, session_id, key, value, valid_from)
        VALUES ($1, $2, $3, $4::text::jsonb, $5)
        ON CONFLICT (id) DO NOTHING""",
    "user_inputs": """
        INSERT INTO graph.user_inputs AS u (id, session_id, ordinal, text, triggered_at, interrupted, kind, origin,
                                            metadata)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb)
        ON CONFLICT (id) DO UPDATE SET interrupted = true
        WHERE EXCLUDED.interrupted AND NOT u.interrupted""",
    "model_invocations": """
        INSERT INTO graph.model_invocations AS m (id, session_id, user_input_id, parent_model_invocation_id, model,
                                                  input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                                                  cache_write_1h_tokens, total_tokens, token_basis, speed,
                                                  stop_reason, started_at, reasoning_tokens)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
        ON CONFLICT (id) DO UPDATE SET
            input_tokens = EXCLUDED.input_tokens,
            output_tokens = EXCLUDED.output_tokens,
            reasoning_tokens = EXCLUDED.reasoning_tokens,
            cache_read_tokens = EXCLUDED.cache_read_tokens,
            cache_write_tokens = EXCLUDED.cache_write_tokens,
            cache_write_1h_tokens = EXCLUDED.cache_write_1h_tokens,
            total_tokens = EXCLUDED.total_tokens,
            token_basis = EXCLUDED.token_basis,
            speed = coalesce(EXCLUDED.speed, m.speed),
            stop_reason = coalesce(EXCLUDED.stop_reason, m.stop_reason)
        WHERE EXCLUDED.total_tokens > m.total_tokens
           OR (m.stop_reason IS NULL AND EXCLUDED.stop_reason IS NOT NULL
               AND EXCLUDED.total_tokens >= m.total_tokens)""",
    "assistant_messages": """
        INSERT INTO graph.assistant_messages (id, session_id, user_input_id, model_invocation_id, text, content,
                                              "timestamp")
        VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7)
        ON CONFLICT (id) DO NOTHING""",
    "tool_uses": """
        INSERT INTO graph.tool_uses AS t (id, session_id, user_input_id, model_invocation_id, name, verb, input,
                                          status, metadata, "timestamp")
        VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9::text::jsonb, $10)
        ON CONFLICT (id) DO UPDATE SET
            status = CASE WHEN t.status = 'no_result' THEN EXCLUDED.status ELSE t.status END,
            metadata = EXCLUDED.metadata
        WHERE (EXCLUDED.status <> 'no_result' OR t.status = 'no_result')
          AND (t.status, t.metadata) IS DISTINCT FROM
              (CASE WHEN t.status = 'no_result' THEN EXCLUDED.status ELSE t.status END, EXCLUDED.metadata)""",
    "tool_results": """
        INSERT INTO graph.tool_results (id, tool_use_id, session_id, user_input_id, status, output_text, output,
                                        error_text, "timestamp")
        VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9)
        ON CONFLICT (id) DO NOTHING""",
    "file_touches": """
        INSERT INTO graph.file_touches (id, tool_use_id, user_input_id, session_id, path, kind, start_line, end_line,
                                        hunks)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb)
        ON CONFLICT (id) DO NOTHING""",
    "token_usage": """
        INSERT INTO graph.token_usage (id, session_id, user_input_id, scope, model, input_tokens, output_tokens,
                                       cache_read_tokens, cache_write_tokens, total_tokens, api_call_count,
                                       token_basis, speed)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
        ON CONFLICT (id) DO NOTHING""",
    "vendor_ids": """
        INSERT INTO graph.vendor_ids (our_type, vendor, vendor_id_kind, vendor_id, our_id, session_id, source_ref)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (our_type, vendor, vendor_id_kind, vendor_id) DO NOTHING""",
}
#: A profile's deletion: the sessions its imports created and, by ON DELETE CASCADE, every row of theirs.
PROFILE_DELETE: Final = "DELETE FROM graph.sessions WHERE profile_id = $1"

Rows = dict[str, list[tuple[Any, ...]]]

#: Where each statement's rows hold the session they belong to.
_SESSION_COLUMN: Final[dict[str, int]] = {
    "sessions": 0,
    "session_attributes": 1,
    "user_inputs": 1,
    "model_invocations": 1,
    "assistant_messages": 1,
    "tool_uses": 1,
    "tool_results": 2,
    "file_touches": 3,
    "token_usage": 1,
    "vendor_ids": 5,
}

_hunks_encoder: Final = msgspec.json.Encoder()
# Plans checked but not yet applied, by event id; bounded so events that never reach apply cannot pile up.
_MAX_CACHED_PLANS: Final = 16


class GraphEventInvalid(DataError):
    """A ``transcript_imported`` event whose graph cannot be stored; the message says why."""


def _id(value: str) -> uuid.UUID:
    return uuid.UUID(value)


def _opt_id(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold U+0000: stored escaped, losslessly, as the core does (`proto.text`)."""
    return escape_nul(value) if value is not None else None


def _json(raw: msgspec.Raw | bytes | None) -> str | None:
    """Raw JSON as text for a jsonb parameter, every key and string escaped like `_text` (jsonb rejects U+0000)."""
    if raw is None:
        return None
    data = bytes(raw)
    if not data:
        return None
    return escape_nul_in_json(data.decode())


def _time(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def graph_of(event: TranscriptImported) -> Graph:
    """The graph an event carries, decoded with the graph's own rules (raw JSON fields, Go nils)."""
    try:
        return decode_graph(msgspec.json.encode(event.graph))
    except msgspec.DecodeError as exc:
        raise GraphEventInvalid(f"the graph does not decode: {exc}") from exc


def graph_rows(graph: Graph) -> Rows:
    """The parameter tuples of every statement for one graph, in the graph's (parents-first) order."""
    rows: Rows = {name: [] for name in STATEMENTS}
    for s in graph.sessions:
        rows["sessions"].append(
            (
                _id(s.id),
                _opt_id(s.parent_session_id),
                _opt_id(s.spawned_by_tool_use_id),
                _time(s.started_at),
                _time(s.ended_at),
                _text(s.title),
                _text(s.working_dir),
                _text(s.git_branch),
                str(s.outcome),
                _text(s.repo_root),
                _text(s.worktree_root),
            )
        )
    for a in graph.attributes:
        rows["session_attributes"].append(
            (_id(a.id), _id(a.session_id), _text(a.key), _json(a.value), _time(a.valid_from))
        )
    for u in graph.user_inputs:
        rows["user_inputs"].append(
            (
                _id(u.id),
                _id(u.session_id),
                u.ordinal,
                _text(u.text),
                _time(u.triggered_at),
                u.interrupted,
                str(u.kind),
                str(u.origin),
                _json(u.metadata),
            )
        )
    for m in graph.model_invocations:
        rows["model_invocations"].append(
            (
                _id(m.id),
                _id(m.session_id),
                _id(m.user_input_id),
                _opt_id(m.parent_model_invocation_id),
                _text(m.model),
                m.input_tokens,
                m.output_tokens,
                m.cache_read_tokens,
                m.cache_write_tokens,
                m.cache_write_1h_tokens,
                m.total_tokens,
                str(m.token_basis) if m.token_basis else None,
                m.speed,
                _text(m.stop_reason),
                _time(m.started_at),
                m.reasoning_tokens,
            )
        )
    for am in graph.assistant_messages:
        rows["assistant_messages"].append(
            (
                _id(am.id),
                _id(am.session_id),
                _id(am.user_input_id),
                _id(am.model_invocation_id),
                _text(am.text),
                _json(am.content),
                _time(am.timestamp),
            )
        )
    for t in graph.tool_uses:
        rows["tool_uses"].append(
            (
                _id(t.id),
                _id(t.session_id),
                _id(t.user_input_id),
                _id(t.model_invocation_id),
                _text(t.name),
                str(t.verb),
                _json(t.input) or "null",
                str(t.status),
                _json(t.metadata) or "null",
                _time(t.timestamp),
            )
        )
    for r in graph.tool_results:
        rows["tool_results"].append(
            (
                _id(r.id),
                _id(r.tool_use_id),
                _id(r.session_id),
                _id(r.user_input_id),
                str(r.status),
                _text(r.output_text),
                _json(r.output),
                _text(r.error_text),
                _time(r.timestamp),
            )
        )
    for f in graph.file_touches:
        hunks = _json(_hunks_encoder.encode(f.hunks)) if f.hunks is not None else None
        rows["file_touches"].append(
            (
                _id(f.id),
                _opt_id(f.tool_use_id),
                _id(f.user_input_id),
                _id(f.session_id),
                _text(f.path),
                str(f.kind),
                f.start_line,
                f.end_line,
                hunks,
            )
        )
    for tu in graph.token_usage:
        rows["token_usage"].append(
            (
                _id(tu.id),
                _id(tu.session_id),
                _opt_id(tu.user_input_id),
                str(tu.scope),
                _text(tu.model),
                tu.input_tokens,
                tu.output_tokens,
                tu.cache_read_tokens,
                tu.cache_write_tokens,
                tu.total_tokens,
                tu.api_call_count,
                str(tu.token_basis) if tu.token_basis else None,
                tu.speed,
            )
        )
    for v in graph.vendor_ids:
        rows["vendor_ids"].append(
            (
                str(v.our_type),
                _text(v.vendor),
                _text(v.vendor_id_kind),
                _text(v.vendor_id),
                _id(v.our_id),
                _id(v.session_id),
                _text(v.source_ref),
            )
        )
    return rows


def plan_event(event: TranscriptImported) -> Rows:
    """Decode, validate and turn one event's graph into rows; GraphEventInvalid says what is wrong.

    A part that is not ``self_contained`` is validated on its own rows (``validate(partial=True)``);
    whatever it holds, a top-level session in it must be the event's session.
    """
    if event.part > event.parts:
        raise GraphEventInvalid(f"part {event.part} of {event.parts}")
    graph = graph_of(event)
    try:
        validate(graph, partial=not event.self_contained)
    except GraphInvalid as exc:
        raise GraphEventInvalid(str(exc)) from exc
    root = graph.root()
    if root is not None and root.id != str(event.session_id):
        raise GraphEventInvalid(f"the graph's root session {root.id} is not the event's session {event.session_id}")
    try:
        return graph_rows(graph)
    except ValueError as exc:  # an id that is not a UUID
        raise GraphEventInvalid(f"bad id in the graph: {exc}") from exc


class GraphProjection(Projection):
    """Projects ``transcript_imported`` events into the ``graph`` schema; other events pass by.

    A profile's deletion deletes the sessions of its imports at its place in the stream and is remembered in
    ``graph.profile_deletions`` (``commonos.runtime.tombstones``): the profile's transcripts after it are
    ``profile_deleted`` dead letters until a ``profile_upserted`` re-creates the profile.
    """

    position_table = "graph.positions"
    filter_subjects = ("cos.events.*.*.transcript_imported", PROFILES_FILTER)
    tables = rebuilt(TABLES)

    def __init__(self, name: str = "graph-writer") -> None:
        self.name = name
        self._plans: OrderedDict[uuid.UUID, Rows] = OrderedDict()
        self.deletions = ProfileTombstones(DELETIONS_TABLE)

    def check(self, event: Event) -> None:
        check_profile_event(event)
        if not isinstance(event, TranscriptImported):
            return
        plan = plan_event(event)
        self._plans[event.event_id] = plan
        while len(self._plans) > _MAX_CACHED_PLANS:
            self._plans.popitem(last=False)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        events = await self.deletions.screen(conn, events, refuse=(TranscriptImported,))
        # The transcripts between two deletions are stored together, then the deletion runs.
        plans: list[tuple[TranscriptImported, Rows]] = []
        for event in events:
            if isinstance(event, ProfileDeleted):
                await _store(conn, plans)
                plans = []
                await conn.execute(PROFILE_DELETE, event.profile_id)
            elif isinstance(event, TranscriptImported):
                plan = self._plans.pop(event.event_id, None)
                if plan is None:
                    plan = plan_event(event)
                plans.append((event, plan))
        await _store(conn, plans)


async def _store(conn: Conn, plans: Sequence[tuple[TranscriptImported, Rows]]) -> None:
    """The rows of these events' graphs, parents first, each as its profile's."""
    if not plans:
        return
    await _check_owners(conn, plans)
    batch: Rows = {name: [] for name in STATEMENTS}
    for event, plan in plans:
        for name, rows in plan.items():
            batch[name].extend([(*row, event.profile_id) for row in rows] if name == "sessions" else rows)
    for name, sql in STATEMENTS.items():
        if batch[name]:
            await conn.executemany(sql, batch[name])


async def _check_owners(conn: Conn, plans: Sequence[tuple[TranscriptImported, Rows]]) -> None:
    """Every session a part's rows belong to must be unknown or its own profile's (`profile_mismatch`)."""
    sessions_of = [
        (event, {row[_SESSION_COLUMN[name]] for name, rows in plan.items() for row in rows}) for event, plan in plans
    ]
    ids = list({s for _, sessions in sessions_of for s in sessions})
    if not ids:
        return
    found = await conn.fetch(
        "SELECT id, profile_id FROM graph.sessions WHERE id = ANY($1::uuid[]) AND profile_id IS NOT NULL", ids
    )
    owners: dict[uuid.UUID, str] = {r["id"]: r["profile_id"] for r in found}
    for event, sessions in sessions_of:
        for session in sessions:
            owner = owners.setdefault(session, event.profile_id)
            if owner != event.profile_id:
                raise mismatch(event, owner)


#: The session graph's projection as registered (`commonos.projections` in pyproject.toml).
REGISTRATION: Final = Registration(
    "graph", "journal-writer", TABLES, make=lambda suffix: GraphProjection("graph-writer" + suffix), prelude=PRELUDE
)

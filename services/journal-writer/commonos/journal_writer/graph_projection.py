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
from typing import TYPE_CHECKING, Any, Final, overload

import msgspec

from commonos.journal_writer.graph_schema import (
    ASSISTANT_MESSAGES,
    DELETIONS_TABLE,
    FILE_TOUCHES,
    MODEL_INVOCATIONS,
    PRELUDE,
    ROW_TABLES,
    SESSION_ATTRIBUTES,
    SESSIONS,
    TABLES,
    TOKEN_USAGE,
    TOOL_RESULTS,
    TOOL_USES,
    USER_INPUTS,
    VENDOR_IDS,
    AssistantMessage,
    FileTouch,
    GraphSession,
    ModelInvocation,
    SessionAttribute,
    TokenUsageRow,
    ToolResult,
    ToolUse,
    UserInput,
    VendorId,
)
from commonos.proto.events import Event, ProfileDeleted, TranscriptImported
from commonos.proto.graph import Graph, GraphInvalid, validate
from commonos.proto.subjects import PROFILES_FILTER
from commonos.proto.text import escape_nul_in_json
from commonos.runtime.errors import DataError
from commonos.runtime.owners import mismatch
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tables import Table, Upsert
from commonos.runtime.tombstones import ProfileTombstones, check_profile_event

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

#: How each table's rows are written (parents first, `ROW_TABLES`); every statement is idempotent. A table
#: that updates a stored row (`Upsert`) is written row by row: one batch may hold a row twice (two parts of
#: a growing transcript), and the later must see the earlier, which a bulk insert cannot do.
STATEMENTS: Final[dict[Table, str]] = {
    t: t.insert_one() if isinstance(t.conflict, Upsert) else t.insert_bulk() for t in ROW_TABLES
}
#: A profile's deletion: the sessions its imports created and, by ON DELETE CASCADE, every row of theirs.
PROFILE_DELETE: Final = "DELETE FROM graph.sessions WHERE profile_id = $1"

#: The rows of a graph, by table (`ROW_TABLES`): each a Struct of the table's row type.
Rows = dict[Table, list[Any]]

_hunks_encoder: Final = msgspec.json.Encoder()
# Plans checked but not yet applied, by event id; bounded so events that never reach apply cannot pile up.
_MAX_CACHED_PLANS: Final = 16


class GraphEventInvalid(DataError):
    """A ``transcript_imported`` event whose graph cannot be stored; the message says why."""


def _id(value: str) -> uuid.UUID:
    return uuid.UUID(value)


def _opt_id(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _json(raw: msgspec.Raw | bytes | None) -> str | None:
    """Raw JSON as text for a jsonb parameter, every key and string escaped as the table escapes text columns
    (`commonos.proto.text`: PostgreSQL's text and jsonb cannot hold U+0000)."""
    if raw is None:
        return None
    data = bytes(raw)
    if not data:
        return None
    return escape_nul_in_json(data.decode())


@overload
def _time(value: datetime) -> datetime: ...
@overload
def _time(value: datetime | None) -> datetime | None: ...
def _time(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def graph_rows(graph: Graph, profile_id: str | None) -> Rows:
    """The rows of one graph, by table, in the graph's (parents-first) order; its sessions are `profile_id`'s."""
    return {
        SESSIONS: [
            GraphSession(
                id=_id(s.id),
                parent_session_id=_opt_id(s.parent_session_id),
                spawned_by_tool_use_id=_opt_id(s.spawned_by_tool_use_id),
                started_at=_time(s.started_at),
                ended_at=_time(s.ended_at),
                title=s.title,
                working_dir=s.working_dir,
                git_branch=s.git_branch,
                outcome=s.outcome,
                repo_root=s.repo_root,
                worktree_root=s.worktree_root,
                profile_id=profile_id,
            )
            for s in graph.sessions
        ],
        SESSION_ATTRIBUTES: [
            SessionAttribute(
                id=_id(a.id),
                session_id=_id(a.session_id),
                key=a.key,
                value=_json(a.value),
                valid_from=_time(a.valid_from),
            )
            for a in graph.attributes
        ],
        USER_INPUTS: [
            UserInput(
                id=_id(u.id),
                session_id=_id(u.session_id),
                ordinal=u.ordinal,
                text=u.text,
                triggered_at=_time(u.triggered_at),
                interrupted=u.interrupted,
                kind=u.kind,
                origin=u.origin,
                metadata=_json(u.metadata),
            )
            for u in graph.user_inputs
        ],
        MODEL_INVOCATIONS: [
            ModelInvocation(
                id=_id(m.id),
                session_id=_id(m.session_id),
                user_input_id=_id(m.user_input_id),
                parent_model_invocation_id=_opt_id(m.parent_model_invocation_id),
                model=m.model,
                input_tokens=m.input_tokens,
                output_tokens=m.output_tokens,
                cache_read_tokens=m.cache_read_tokens,
                cache_write_tokens=m.cache_write_tokens,
                cache_write_1h_tokens=m.cache_write_1h_tokens,
                total_tokens=m.total_tokens,
                token_basis=m.token_basis or None,
                speed=m.speed,
                stop_reason=m.stop_reason,
                started_at=_time(m.started_at),
                reasoning_tokens=m.reasoning_tokens,
            )
            for m in graph.model_invocations
        ],
        ASSISTANT_MESSAGES: [
            AssistantMessage(
                id=_id(am.id),
                session_id=_id(am.session_id),
                user_input_id=_id(am.user_input_id),
                model_invocation_id=_id(am.model_invocation_id),
                text=am.text,
                content=_json(am.content),
                timestamp=_time(am.timestamp),
            )
            for am in graph.assistant_messages
        ],
        TOOL_USES: [
            ToolUse(
                id=_id(t.id),
                session_id=_id(t.session_id),
                user_input_id=_id(t.user_input_id),
                model_invocation_id=_id(t.model_invocation_id),
                name=t.name,
                verb=t.verb,
                input=_json(t.input) or "null",
                status=t.status,
                metadata=_json(t.metadata) or "null",
                timestamp=_time(t.timestamp),
            )
            for t in graph.tool_uses
        ],
        TOOL_RESULTS: [
            ToolResult(
                id=_id(r.id),
                tool_use_id=_id(r.tool_use_id),
                session_id=_id(r.session_id),
                user_input_id=_id(r.user_input_id),
                status=r.status,
                output_text=r.output_text,
                output=_json(r.output),
                error_text=r.error_text,
                timestamp=_time(r.timestamp),
            )
            for r in graph.tool_results
        ],
        FILE_TOUCHES: [
            FileTouch(
                id=_id(f.id),
                tool_use_id=_opt_id(f.tool_use_id),
                user_input_id=_id(f.user_input_id),
                session_id=_id(f.session_id),
                path=f.path,
                kind=f.kind,
                start_line=f.start_line,
                end_line=f.end_line,
                hunks=_json(_hunks_encoder.encode(f.hunks)) if f.hunks is not None else None,
            )
            for f in graph.file_touches
        ],
        TOKEN_USAGE: [
            TokenUsageRow(
                id=_id(tu.id),
                session_id=_id(tu.session_id),
                user_input_id=_opt_id(tu.user_input_id),
                scope=tu.scope,
                model=tu.model,
                input_tokens=tu.input_tokens,
                output_tokens=tu.output_tokens,
                cache_read_tokens=tu.cache_read_tokens,
                cache_write_tokens=tu.cache_write_tokens,
                total_tokens=tu.total_tokens,
                api_call_count=tu.api_call_count,
                token_basis=tu.token_basis or None,
                speed=tu.speed,
            )
            for tu in graph.token_usage
        ],
        VENDOR_IDS: [
            VendorId(
                our_type=v.our_type,
                vendor=v.vendor,
                vendor_id_kind=v.vendor_id_kind,
                vendor_id=v.vendor_id,
                our_id=_id(v.our_id),
                session_id=_id(v.session_id),
                source_ref=v.source_ref,
            )
            for v in graph.vendor_ids
        ],
    }


def plan_event(event: TranscriptImported) -> Rows:
    """Validate one event's graph and turn it into rows; GraphEventInvalid says what is wrong.

    A part that is not ``self_contained`` is validated on its own rows (``validate(partial=True)``);
    whatever it holds, a top-level session in it must be the event's session.
    """
    if event.part > event.parts:
        raise GraphEventInvalid(f"part {event.part} of {event.parts}")
    graph = event.graph
    try:
        validate(graph, partial=not event.self_contained)
    except GraphInvalid as exc:
        raise GraphEventInvalid(str(exc)) from exc
    root = graph.root()
    if root is not None and root.id != str(event.session_id):
        raise GraphEventInvalid(f"the graph's root session {root.id} is not the event's session {event.session_id}")
    try:
        return graph_rows(graph, event.profile_id)
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
    """The rows of these events' graphs, parents first."""
    if not plans:
        return
    await _check_owners(conn, plans)
    for table, sql in STATEMENTS.items():
        rows = [row for _, plan in plans for row in plan[table]]
        if not rows:
            continue
        if isinstance(table.conflict, Upsert):
            await conn.executemany(sql, [table.row_args(row) for row in rows])
        else:
            await conn.execute(sql, *table.bulk_args(rows))


def _session_of(table: Table, row: Any) -> uuid.UUID:
    return row.id if table is SESSIONS else row.session_id  # type: ignore[no-any-return]


async def _check_owners(conn: Conn, plans: Sequence[tuple[TranscriptImported, Rows]]) -> None:
    """Every session a part's rows belong to must be unknown or its own profile's (`profile_mismatch`)."""
    sessions_of = [
        (event, {_session_of(table, row) for table, rows in plan.items() for row in rows}) for event, plan in plans
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

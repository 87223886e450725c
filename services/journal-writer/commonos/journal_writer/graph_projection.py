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

import types
import typing
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

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
_R = TypeVar("_R", bound=msgspec.Struct)
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


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """How a graph record's value becomes a row's column of type `hint` (None: as it is)."""
    nullable = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = set(typing.get_args(hint)) - {type(None)} if nullable else {hint}
    if args == {uuid.UUID}:
        return _opt_id if nullable else _id
    if args == {datetime}:
        return _time
    if args == {Any}:
        return _json
    return None


@cache
def _conversions(row: type[msgspec.Struct]) -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    hints = typing.get_type_hints(row)
    return tuple((name, _converter(hints[name])) for name in row.__struct_fields__)


def _row(row: type[_R], record: Any, **given: Any) -> _R:
    """The row of a graph record: each column the record's field of the same name, converted by the column's
    type (ids, times, raw JSON), or the value `given` for it."""
    values = dict(given)
    for name, convert in _conversions(row):
        if name not in values:
            value = getattr(record, name)
            values[name] = value if convert is None else convert(value)
    return row(**values)


def graph_rows(graph: Graph, profile_id: str | None) -> Rows:
    """The rows of one graph, by table, in the graph's (parents-first) order; its sessions are `profile_id`'s."""
    return {
        SESSIONS: [_row(GraphSession, s, profile_id=profile_id) for s in graph.sessions],
        SESSION_ATTRIBUTES: [_row(SessionAttribute, a) for a in graph.attributes],
        USER_INPUTS: [_row(UserInput, u) for u in graph.user_inputs],
        MODEL_INVOCATIONS: [
            _row(ModelInvocation, m, token_basis=m.token_basis or None) for m in graph.model_invocations
        ],
        ASSISTANT_MESSAGES: [_row(AssistantMessage, am) for am in graph.assistant_messages],
        TOOL_USES: [
            _row(ToolUse, t, input=_json(t.input) or "null", metadata=_json(t.metadata) or "null")
            for t in graph.tool_uses
        ],
        TOOL_RESULTS: [_row(ToolResult, r) for r in graph.tool_results],
        FILE_TOUCHES: [
            _row(FileTouch, f, hunks=_json(_hunks_encoder.encode(f.hunks)) if f.hunks is not None else None)
            for f in graph.file_touches
        ],
        TOKEN_USAGE: [_row(TokenUsageRow, tu, token_basis=tu.token_basis or None) for tu in graph.token_usage],
        VENDOR_IDS: [_row(VendorId, v) for v in graph.vendor_ids],
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

"""Pure projection: events -> the row operations of the core tables. No I/O here.

A batch of events becomes one `Plan`: for each statement, the argument tuples in stream order.
The store runs the statements in a fixed parent-before-child order (`STATEMENTS`), which keeps
every dependency of one session's events, because an event only ever depends on earlier events of
kinds that come before it in that order (a session before its turns, a turn before its messages
and tool calls, a message before its deactivation, a turn's start before its finish). A profile's
deletion comes last, and ends its plan: a batch holding one is planned in segments (`plan_segments`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, assert_never, cast

import msgspec

from commonos.journal_writer import schema
from commonos.proto import events as ev
from commonos.proto.identity import stored_title, title_from_text
from commonos.proto.ids import APPROVAL_NAMESPACE
from commonos.proto.messages import UserMessage
from commonos.proto.text import escape_nul, escape_nul_in_json
from commonos.runtime import partitions
from commonos.runtime.errors import DataError
from commonos.runtime.tables import Table
from commonos.runtime.tombstones import ProfileEventInvalid, check_profile_event

_content_encoder: Final = msgspec.json.Encoder()


@dataclass(frozen=True)
class Param:
    """A statement's parameter: its name in the SQL templates and the PostgreSQL type of its value.

    `jsonb` travels as JSON text, `text[]` as a list (one row) or an array literal (bulk: arrays of arrays must
    be rectangular, tags are not).
    """

    name: str
    type: str

    def one(self, index: int) -> str:
        """The parameter in the single-row form."""
        return f"${index}::text" if self.type == "jsonb" else f"${index}::{self.type}"

    def column(self, index: int) -> str:
        """The parameter's array in the bulk form's `unnest`."""
        return f"${index}::text[]" if self.type in ("jsonb", "text[]") else f"${index}::{self.type}[]"

    def bulk(self) -> str:
        """The parameter's value in a row of the bulk form."""
        return f"r.{self.name}::text[]" if self.type == "text[]" else f"r.{self.name}"


def _params(spec: str) -> tuple[Param, ...]:
    """`"id uuid, tags text[], ..."` -> the Params."""
    return tuple(Param(*item.split()) for item in spec.split(","))


@dataclass(frozen=True)
class Insert:
    """`INSERT INTO table (columns) <one row of params> ON CONFLICT ...`, written once.

    `values` are expressions over the params, one per column, `{name}` standing for a param (a jsonb value is
    written `{name}::jsonb`).
    """

    table: str
    params: tuple[Param, ...]
    columns: dict[str, str]
    conflict: str
    #: The param holding the row's id when the table is partitioned by time and the first row of an id wins
    #: across its months (which its key, `(id, <time>)`, cannot say): a row whose id is stored, at whatever
    #: time, is skipped (`partitions.stored_nowhere`), and of a batch's rows of one id the first is written.
    first_of_id: str | None = None

    def _values(self, refs: dict[str, str]) -> str:
        return ", ".join(value.format_map(refs) for value in self.columns.values())

    def _unless_stored(self, ref: str) -> str:
        return f"WHERE {partitions.stored_nowhere(self.table, ref)} "

    def one(self) -> str:
        refs = {p.name: p.one(i) for i, p in enumerate(self.params, 1)}
        head = f"INSERT INTO {self.table} ({', '.join(self.columns)}) "
        if self.first_of_id is not None:
            return f"{head}SELECT {self._values(refs)} {self._unless_stored(refs[self.first_of_id])}{self.conflict}"
        return f"{head}VALUES ({self._values(refs)}) {self.conflict}"

    def bulk(self) -> str:
        refs = {p.name: p.bulk() for p in self.params}
        arrays = ", ".join(p.column(i) for i, p in enumerate(self.params, 1))
        names = ", ".join(p.name for p in self.params)
        rows = f"unnest({arrays}) AS r({names})"
        guard = ""
        if self.first_of_id is not None:
            key = self.first_of_id
            rows = (
                f"(SELECT DISTINCT ON ({key}) * FROM unnest({arrays}) WITH ORDINALITY AS r({names}, n) "
                f"ORDER BY {key}, n) r"
            )
            guard = self._unless_stored(f"r.{key}")
        return (
            f"INSERT INTO {self.table} ({', '.join(self.columns)}) SELECT {self._values(refs)} "
            f"FROM {rows} {guard}{self.conflict}"
        )


@dataclass(frozen=True)
class Update:
    """`UPDATE table t SET ... WHERE ...` of the rows `key` names, written once (`{name}` stands for a param).

    The bulk form applies each key's first row only, as the single-row form run row after row does: each
    update is guarded by its own condition (`finished_at IS NULL`, ...), so the first of a key wins.
    """

    table: str
    params: tuple[Param, ...]
    set: str
    where: str
    #: The param holding the row's key, and the table's key column.
    key: str = "id"
    key_column: str = "id"

    def one(self) -> str:
        refs = {p.name: p.one(i) for i, p in enumerate(self.params, 1)}
        return f"UPDATE {self.table} t SET {self.set.format_map(refs)} WHERE {self.where.format_map(refs)}"

    def _source(self) -> str:
        arrays = ", ".join(p.column(i) for i, p in enumerate(self.params, 1))
        names = ", ".join(p.name for p in self.params)
        return f"unnest({arrays}) WITH ORDINALITY AS r({names}, n)"

    def _update_from(self, rows: str) -> str:
        refs = {p.name: f"r.{p.name}" for p in self.params}
        return (
            f"UPDATE {self.table} t SET {self.set.format_map(refs)} "
            f"FROM (SELECT DISTINCT ON ({self.key}) * FROM {rows} ORDER BY {self.key}, n) r "
            f"WHERE {self.where.format_map(refs)}"
        )

    def bulk(self) -> str:
        return self._update_from(self._source())

    def checked(self) -> str:
        """The bulk form returning the keys it found no row for (see `CHECKED`)."""
        return (
            f"WITH r AS (SELECT * FROM {self._source()}), "
            f"done AS ({self._update_from('r')} RETURNING t.{self.key_column}) "
            f"SELECT r.{self.key} FROM r WHERE NOT EXISTS "
            f"(SELECT 1 FROM {self.table} t WHERE t.{self.key_column} = r.{self.key})"
        )


def _do_nothing(table: Table) -> str:
    """`ON CONFLICT (<primary key>) DO NOTHING`: `(id)`, `(id, <time>)` for a partitioned table."""
    return f"ON CONFLICT ({', '.join(table.conflict_key)}) DO NOTHING"


#: Statements in the order they run; every one is idempotent (natural keys, ON CONFLICT). Each is written
#: once: `STATEMENTS` holds their single-row forms, `BULK` the bulk forms of those that have one.
_SPECS: Final[dict[str, str | Insert | Update]] = {
    # created_at is the earliest mention of the profile, updated_at the latest profile_upserted and
    # tags come from that one: min and max commute, so partitioned writers agree on the row.
    "profile_upsert": """
        INSERT INTO profiles (id, tags, created_at, updated_at) VALUES ($1, $2, $3, $3)
        ON CONFLICT (id) DO UPDATE SET
            tags = CASE WHEN profiles.updated_at IS NULL OR profiles.updated_at <= EXCLUDED.updated_at
                        THEN EXCLUDED.tags ELSE profiles.tags END,
            updated_at = greatest(profiles.updated_at, EXCLUDED.updated_at),
            created_at = least(profiles.created_at, EXCLUDED.created_at)""",
    # The profile of a session exists before its session even where the cache of `prepare` is stale (a
    # table emptied under a running writer); it takes no lock on an existing row.
    "profile_exists": """
        INSERT INTO profiles (id, tags, created_at, updated_at) VALUES ($1, '{}', $2, NULL)
        ON CONFLICT (id) DO NOTHING""",
    "session_insert": Insert(
        "sessions",
        _params("id uuid, profile_id text, source text, title text, tags text[], parent uuid, at timestamptz"),
        {
            "id": "{id}",
            "profile_id": "{profile_id}",
            "source": "{source}",
            "title": "{title}",
            "tags": "{tags}",
            "parent_session_id": "{parent}",
            "created_at": "{at}",
            "updated_at": "{at}",
        },
        _do_nothing(schema.SESSIONS),
    ),
    "turn_insert": Insert(
        "turns",
        _params("id uuid, session_id uuid, profile_id text, parent uuid, tags text[], depth int, at timestamptz"),
        {
            "id": "{id}",
            "session_id": "{session_id}",
            "profile_id": "{profile_id}",
            "parent_turn_id": "{parent}",
            "tags": "{tags}",
            "depth": "{depth}",
            "started_at": "{at}",
        },
        _do_nothing(schema.TURNS),
        first_of_id="id",
    ),
    "session_snapshot": Update(
        "sessions",
        _params("id uuid, snap jsonb, at timestamptz"),
        set="context_snapshot = {snap}::jsonb, updated_at = greatest(t.updated_at, {at})",
        where="t.id = {id} AND t.context_snapshot IS NULL",
    ),
    "message_insert": Insert(
        "messages",
        _params(
            "id uuid, session_id uuid, turn_id uuid, profile_id text, seq int, role text, content jsonb, at timestamptz"
        ),
        {
            "id": "{id}",
            "session_id": "{session_id}",
            "turn_id": "{turn_id}",
            "profile_id": "{profile_id}",
            "seq": "{seq}",
            "role": "{role}",
            "content": "{content}::jsonb",
            "created_at": "{at}",
        },
        _do_nothing(schema.MESSAGES),
        first_of_id="id",
    ),
    "session_title": Update(
        "sessions", _params("id uuid, title text"), set="title = {title}", where="t.id = {id} AND t.title IS NULL"
    ),
    # One row names several messages (an array per row): no bulk form.
    "message_deactivate": Update(
        "messages",
        _params("ids uuid[], session_id uuid"),
        set="active = false",
        where="t.id = ANY({ids}) AND t.session_id = {session_id} AND t.active",
    ),
    "tool_call_insert": Insert(
        "tool_calls",
        _params(
            "id uuid, turn_id uuid, session_id uuid, profile_id text, call_id text, name text, args jsonb, "
            "result text, is_error bool, risk text, approval text, started timestamptz, finished timestamptz"
        ),
        {
            "id": "{id}",
            "turn_id": "{turn_id}",
            "session_id": "{session_id}",
            "profile_id": "{profile_id}",
            "call_id": "{call_id}",
            "name": "{name}",
            "args": "{args}::jsonb",
            "result": "{result}",
            "is_error": "{is_error}",
            "risk": "{risk}",
            "approval": "{approval}",
            "started_at": "{started}",
            "finished_at": "{finished}",
        },
        _do_nothing(schema.TOOL_CALLS),
        first_of_id="id",
    ),
    "approval_insert": Insert(
        "approvals",
        _params(
            "id uuid, tool_call_id uuid, turn_id uuid, profile_id text, status text, decided_by text, "
            "decided_at timestamptz"
        ),
        {
            "id": "{id}",
            "tool_call_id": "{tool_call_id}",
            "turn_id": "{turn_id}",
            "profile_id": "{profile_id}",
            "status": "{status}",
            "decided_by": "{decided_by}",
            "decided_at": "{decided_at}",
        },
        # One approval a tool call (its id derives from the tool call's): the first decision stays.
        _do_nothing(schema.APPROVALS),
        first_of_id="id",
    ),
    "turn_finish": Update(
        "turns",
        _params("id uuid, status text, error text, at timestamptz"),
        set="status = {status}, error = {error}, finished_at = {at}",
        where="t.id = {id} AND t.finished_at IS NULL",
    ),
    # Last: a plan ends at a profile's deletion (`plan_segments`), so the rows of the events before it are
    # written first. ON DELETE CASCADE takes its sessions, turns, messages, tool calls and approvals along.
    "profile_delete": """
        DELETE FROM profiles WHERE id = $1""",
}
#: Statements with one array per row (no bulk form: arrays of arrays must be rectangular).
_NO_BULK: Final = frozenset({"message_deactivate"})

#: The single-row form of each statement, in the order they run (for `executemany`).
STATEMENTS: Final[dict[str, str]] = {k: v if isinstance(v, str) else v.one() for k, v in _SPECS.items()}
#: The bulk form: one round trip for all of a batch's rows, the arguments being one array per column
#: (`unnest`). Array-valued columns (tags) travel as array literals.
BULK: Final[dict[str, str]] = {k: v.bulk() for k, v in _SPECS.items() if not isinstance(v, str) and k not in _NO_BULK}
#: Updates of rows an earlier event must have created. Each returns the keys it found no row for: an
#: event updating what does not exist (a turn finished before it started, messages of another session)
#: is rejected and dead-lettered, so a replay after the fix completes the picture, where a silent
#: UPDATE of 0 rows would leave it incomplete forever. A row that exists but was already updated (the
#: turn already finished) is not an error: the first finish wins.
CHECKED: Final[dict[str, str]] = {
    "turn_finish": cast(Update, _SPECS["turn_finish"]).checked(),
    "message_deactivate": f"""
        WITH done AS ({STATEMENTS["message_deactivate"]} RETURNING t.id)
        SELECT m FROM unnest($1::uuid[]) AS m
        WHERE NOT EXISTS (SELECT 1 FROM messages WHERE id = m AND session_id = $2)""",
}

#: The first message of a batch's messages (`$1` ids, `$2` sessions, `$3` seqs) whose session already holds
#: another message at its seq. `messages` is partitioned by month, so `UNIQUE (session_id, seq)` cannot be a
#: constraint; the writer keeps it, as it applies a session's events in order. A session's messages are no
#: older than the session (a day of clock skew between producers allowed): the months before are pruned.
SEQ_TAKEN: Final = """
    SELECT r.id, r.session_id, r.seq, m.id AS holder
    FROM unnest($1::uuid[], $2::uuid[], $3::int[]) AS r(id, session_id, seq)
    JOIN sessions s ON s.id = r.session_id
    JOIN messages m ON m.session_id = r.session_id AND m.seq = r.seq AND m.id <> r.id
        AND m.created_at >= s.created_at - interval '1 day'
    LIMIT 1"""

#: Columns holding a list (tags), sent to the bulk form as a Postgres array literal.
ARRAY_COLUMNS: Final[dict[str, int]] = {
    k: i
    for k, v in _SPECS.items()
    if isinstance(v, Insert | Update) and k in BULK
    for i, p in enumerate(v.params)
    if p.type == "text[]"
}
#: Below this many rows a plain executemany is as cheap as building the arrays.
BULK_MIN_ROWS: Final = 4


def array_literal(items: Sequence[str]) -> str:
    """A text[] literal; tags never hold quotes, commas, braces or spaces (the tag format forbids them)."""
    return "{" + ",".join(items) + "}"


def columns(statement: str, rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows to one list per column, for the bulk form of `statement`."""
    cols = [list(c) for c in zip(*rows, strict=True)]
    array_col = ARRAY_COLUMNS.get(statement)
    if array_col is not None:
        cols[array_col] = [array_literal(v) for v in cols[array_col]]
    return cols


#: Event types other projections store (billing, memory, the graph-writer): `plan_event` adds no row for them.
PROJECTED_ELSEWHERE: Final[tuple[type[ev.EventBase], ...]] = (
    ev.MemoryChanged,
    ev.ModelCallCompleted,
    ev.ModelCallRefused,
    ev.TranscriptImported,
)
#: The core's events about one session: each must come from the profile that created the session (the
#: ownership screen), and none is stored for a deleted profile (the tombstone screen). Every event type this
#: projection stores but the profile-level ones, so a new session-level type is screened without being listed.
SESSION_EVENTS: Final = cast(
    "tuple[type[ev.Event], ...]",
    tuple(t for t in ev.EVENT_TYPES if t not in PROJECTED_ELSEWHERE and not ev.is_profile_event(t)),
)


class InvariantViolation(DataError):
    """An event that is well-formed but cannot be true (it goes to the dead-letter stream)."""


@dataclass
class Plan:
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {k: [] for k in STATEMENTS})
    events: int = 0

    def add(self, statement: str, row: tuple[Any, ...]) -> None:
        self.rows[statement].append(row)


#: Run after a batch's transaction, in its own (see `profiles_mentioned`).
PROFILE_ENSURE: Final = """
    UPDATE profiles SET created_at = $2 WHERE id = $1 AND created_at > $2"""


def profiles_mentioned(events: Sequence[ev.Event]) -> list[tuple[str, datetime]]:
    """Each profile a batch's sessions belong to, with its earliest mention since the profile's last
    deletion in the batch, sorted by id.

    Sessions reference their profile, which may not have been upserted yet (or is upserted by
    another partition's writer), so the batch creates it if missing (`profile_exists`, which takes no
    lock on an existing row). Its created_at is then brought to the earliest mention after the commit,
    in a short transaction of its own, in id order, so concurrent writers never hold the row for a
    whole batch and agree on the result.
    """
    first: dict[str, datetime] = {}
    for event in events:
        if isinstance(event, ev.ProfileDeleted):
            first.pop(event.profile_id, None)  # a re-created profile starts afresh
        elif isinstance(event, ev.SessionCreated):
            seen = first.get(event.profile_id)
            if seen is None or event.occurred_at < seen:
                first[event.profile_id] = event.occurred_at
    return sorted(first.items())


def plan_events(events: Sequence[ev.Event]) -> Plan:
    plan = Plan()
    for event in events:
        plan_event(plan, event)
    return plan


def plan_segments(events: Sequence[ev.Event]) -> list[Plan]:
    """The plans of a batch, one ending at each `profile_deleted` (its `profile_delete` runs last), so that
    the rows of the events before a deletion are written before it and those after it after it."""
    plans = [Plan()]
    for event in events:
        plan_event(plans[-1], event)
        if isinstance(event, ev.ProfileDeleted):
            plans.append(Plan())
    return plans


# PostgreSQL's text and jsonb cannot hold U+0000, which a tool's output or a model's arguments may
# carry: every string parameter is stored escaped (`commonos.proto.text`), losslessly.


def _json(value: Any) -> str:
    """A JSON parameter: every key and string escaped (`escape_nul`)."""
    return escape_nul_in_json(_content_encoder.encode(value).decode())


def _text(value: str | None) -> str | None:
    """A text parameter, escaped (`escape_nul`)."""
    return escape_nul(value) if value is not None else None


def check_event(event: ev.Event) -> None:
    """Raise `InvariantViolation` for an event that is well-formed but cannot be true."""
    match event:
        case ev.SessionCreated() if event.parent_session_id == event.session_id:
            raise InvariantViolation("a session cannot be its own parent")
        case ev.TurnStarted() if (event.depth == 0) != (event.parent_turn_id is None):
            raise InvariantViolation("a turn has a parent turn exactly when its depth is above 0")
        case ev.ToolCallRecorded() if event.finished_at < event.started_at:
            raise InvariantViolation("a tool call cannot finish before it starts")
        case ev.TurnFinished() if event.status == ev.TurnStatus.RUNNING:
            raise InvariantViolation("a finished turn cannot have status 'running'")
        case ev.MessageDeactivated() if not event.message_ids:
            raise InvariantViolation("message_deactivated names no message")
        case ev.ProfileDeleted():
            try:
                check_profile_event(event)
            except ProfileEventInvalid as exc:
                raise InvariantViolation(str(exc)) from None
        case _:
            pass


def plan_event(plan: Plan, event: ev.Event) -> None:
    """Add the row operations of one event to `plan` (the core's events only; others add nothing).

    Call `check_event` first: this function assumes the event's invariants hold.
    """
    plan.events += 1
    match event:
        case ev.ProfileUpserted():
            plan.add("profile_upsert", (event.profile_id, list(event.tags), event.occurred_at))
        case ev.ProfileDeleted():
            plan.add("profile_delete", (event.profile_id,))
        case ev.SessionCreated():
            plan.add("profile_exists", (event.profile_id, event.occurred_at))
            title = _text(stored_title(event.title)) if event.title else None
            plan.add(
                "session_insert",
                (
                    event.session_id,
                    event.profile_id,
                    _text(event.source),
                    title,
                    list(event.tags),
                    event.parent_session_id,
                    event.occurred_at,
                ),
            )
        case ev.TurnStarted():
            plan.add(
                "turn_insert",
                (
                    event.turn_id,
                    event.session_id,
                    event.profile_id,
                    event.parent_turn_id,
                    list(event.tags),
                    event.depth,
                    event.occurred_at,
                ),
            )
            if event.context_snapshot is not None:
                plan.add("session_snapshot", (event.session_id, _json(event.context_snapshot), event.occurred_at))
        case ev.MessageAppended():
            content = event.content
            plan.add(
                "message_insert",
                (
                    event.message_id,
                    event.session_id,
                    event.turn_id,
                    event.profile_id,
                    event.seq,
                    event.role,
                    _json(content),
                    event.occurred_at,
                ),
            )
            if event.seq == 1 and isinstance(content, UserMessage):
                plan.add("session_title", (event.session_id, _text(title_from_text(content.text))))
        case ev.MessageDeactivated():
            plan.add("message_deactivate", (list(event.message_ids), event.session_id))
        case ev.ToolCallRecorded():
            plan.add(
                "tool_call_insert",
                (
                    event.tool_call_id,
                    event.turn_id,
                    event.session_id,
                    event.profile_id,
                    _text(event.call_id),
                    _text(event.name),
                    _json(event.args),
                    _text(event.result),
                    event.is_error,
                    str(event.risk),
                    str(event.approval) if event.approval else None,
                    event.started_at,
                    event.finished_at,
                ),
            )
        case ev.ApprovalDecided():
            plan.add(
                "approval_insert",
                (
                    _approval_id(event.tool_call_id),
                    event.tool_call_id,
                    event.turn_id,
                    event.profile_id,
                    str(event.status),
                    _text(event.decided_by),
                    event.decided_at,
                ),
            )
        case ev.TurnFinished():
            plan.add("turn_finish", (event.turn_id, str(event.status), _text(event.error), event.occurred_at))
        case ev.MemoryChanged() | ev.ModelCallCompleted() | ev.ModelCallRefused() | ev.TranscriptImported():
            # `PROJECTED_ELSEWHERE`: plugin events (model calls, memory) and imported transcripts have
            # projections of their own.
            pass
        case _:
            # mypy fails here when an event type of the union has no case above.
            assert_never(event)


def partition_times(events: Sequence[ev.Event]) -> dict[str, list[datetime]]:
    """The times the rows of `events` are filed under in the monthly partitions, per table: the values
    `plan_event` gives the partition columns (`started_at`, `created_at`, `decided_at`)."""
    out: dict[str, list[datetime]] = {
        schema.TURNS.name: [],
        schema.MESSAGES.name: [],
        schema.TOOL_CALLS.name: [],
        schema.APPROVALS.name: [],
    }
    for event in events:
        if isinstance(event, ev.TurnStarted):
            out[schema.TURNS.name].append(event.occurred_at)
        elif isinstance(event, ev.MessageAppended):
            out[schema.MESSAGES.name].append(event.occurred_at)
        elif isinstance(event, ev.ToolCallRecorded):
            out[schema.TOOL_CALLS.name].append(event.started_at)
        elif isinstance(event, ev.ApprovalDecided):
            out[schema.APPROVALS.name].append(event.decided_at)
    return out


def _approval_id(tool_call_id: uuid.UUID) -> uuid.UUID:
    """One approval per tool call, so its id derives from the tool call's (replays agree)."""
    return uuid.uuid5(APPROVAL_NAMESPACE, str(tool_call_id))

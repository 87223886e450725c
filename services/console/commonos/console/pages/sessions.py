"""Sessions: the list (/sessions, /api/sessions) and one session (/sessions/{id}, /api/sessions/{id}), live.

The list pages by keyset on (created_at, id), newest first: the loop's sessions (index sessions_created) and
the imported Claude Code and Codex sessions of the session graph (graph.sessions, by started_at), merged.
Filters: profile, source (the loop's), status (the latest turn's; an imported session's outcome), tag (the
loop's), vendor (imported only), a time range, and `q`: full-text search over the messages' `search` column
(then only the loop's sessions with a matching message, each with a highlighted snippet of its first match).

A session shows its conversation turn by turn, each tool call with its arguments, result, risk, duration and
approval, each model call with tokens and cost (model_calls), and its delegated child sessions inline under the
turn that delegated. /sessions/{id}/live streams what happens next (server-sent events, HTML fragments for
htmx); /api/sessions/{id}/events the same events as JSON.

With a read replica (COS_DATABASE_READ_URL) the list and the sessions are read from it, as of its lag; a session it
does not have yet is looked for on the primary before it is a 404 (a session started a moment ago from the chat
page opens at once).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

import asyncpg
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup, escape
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from commonos.console.auth import SignedIn
from commonos.console.db import Database, get_db
from commonos.console.live import Live, Overflow
from commonos.console.metrics import LIVE_WATCHERS
from commonos.console.pages import timeline
from commonos.console.templating import render
from commonos.proto.events import encode_event, event_type
from commonos.proto.requests import ApprovalRequest
from commonos.proto.subjects import session_filter
from commonos.runtime.postgres import Conn

router = APIRouter(tags=["sessions"])

Row = asyncpg.Record

Db = Annotated[Database, Depends(get_db)]

PAGE_SIZE: Final = 50
#: The most messages (and tool calls, model calls) one session page shows of each session.
MAX_ROWS: Final = 5000
#: How deep delegated child sessions are shown inline.
MAX_CHILD_DEPTH: Final = 8
#: ts_headline's markers: control characters no message keeps (they are removed from the text first), turned
#: into <mark> only after the snippet has been escaped.
START, STOP = "\x02", "\x03"
HEADLINE_OPTIONS: Final = (
    f'StartSel="{START}", StopSel="{STOP}", MaxWords=30, MinWords=10, MaxFragments=2, FragmentDelimiter=" … "'
)
#: The words of a message, as the generated `search` column reads them.
MESSAGE_TEXT: Final = "coalesce(m.content ->> 'text', '') || ' ' || coalesce(m.content ->> 'content', '')"


# The list.


class SessionRow(BaseModel):
    id: uuid.UUID
    kind: Literal["loop", "imported"]
    profile_id: str | None
    source: str
    vendor: str | None = None
    title: str | None
    tags: list[str]
    status: str | None
    created_at: datetime
    updated_at: datetime | None
    parent_session_id: uuid.UUID | None
    #: The first matching message's words around the match (with `q`), as plain text.
    snippet: str | None = None
    #: The same, escaped, with each match in <mark>…</mark>: safe to insert as HTML.
    snippet_html: str | None = None
    url: str


class SessionFilters(BaseModel):
    profile: str | None = None
    source: str | None = None
    status: str | None = None
    tag: str | None = None
    vendor: str | None = None
    kind: Literal["all", "loop", "imported"] = "all"
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None


class SessionList(BaseModel):
    sessions: list[SessionRow]
    #: Pass as `cursor` for the next (older) page; null on the last page.
    next_cursor: str | None
    filters: SessionFilters


def encode_cursor(created_at: datetime, session_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(session_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        when, sid = json.loads(raw)
        at = datetime.fromisoformat(when)
        if at.tzinfo is None:
            raise ValueError("naive")
        return at, uuid.UUID(sid)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise HTTPException(422, "cursor: not a cursor of this list") from None


def highlight(snippet: str) -> Markup:
    """The snippet escaped, then its match markers turned into <mark>: message text never becomes markup."""
    return Markup(str(escape(snippet)).replace(START, Markup("<mark>")).replace(STOP, Markup("</mark>")))


class _Query:
    """A query's WHERE clauses and their parameters ($1, $2, …)."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self.args: list[Any] = []

    def arg(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args)}"

    def add(self, clause: str) -> None:
        self.where.append(clause)

    def sql(self) -> str:
        return (" WHERE " + " AND ".join(self.where)) if self.where else ""


LATEST_STATUS: Final = "(SELECT t.status FROM turns t WHERE t.session_id = s.id ORDER BY t.started_at DESC LIMIT 1)"


#: With fewer matching messages than this, search starts from the matches (the GIN index, read once: the count
#: and the matching sessions come from the same scan); with more, from the newest sessions, checking each (a
#: common word matches within the first few). A match read costs about 5-10 µs, a session checked (its ~10
#: messages) about 100 µs: at 100,000 sessions a word with 2,158 matches took 20-30 ms from its matches and
#: 250 ms from the newest sessions (2,468 checked), while counting to 5,000 costs a common word 15-35 ms.
FEW_HITS: Final = 5000


def _first_match(session: str, ts: str) -> str:
    """A session's messages in seq order (its (session_id, seq) index) up to the first matching `ts`: OFFSET 0
    keeps the match a filter of those few rows, where the planner would otherwise AND them with a scan of the
    GIN index for every session."""
    return (
        f"(SELECT m.seq, m.content, m.search FROM messages m WHERE m.session_id = {session} ORDER BY m.seq OFFSET 0) m "
        f"WHERE m.search @@ websearch_to_tsquery('english', {ts}) ORDER BY m.seq LIMIT 1"
    )


def _loop_query(
    f: SessionFilters, after: tuple[datetime, uuid.UUID] | None, limit: int, hits: list[uuid.UUID] | None = None
) -> tuple[str, list[Any]]:
    """The loop's sessions; with `q`, those with a matching message, each with its first match's snippet.

    `hits` (with `q`): every session with a match, when they were few; the page comes from them, looked up by id.
    Without it, from the newest sessions, each checked in seq order until a message matches. The search's
    statements are planned for their own `q` (plan_cache_mode, see list_sessions): the tsquery is computed
    once, when planning, and a rare word's estimate is its own.
    """
    q = _Query()
    source = "sessions s"
    select = (
        "SELECT s.id, 'loop' AS kind, s.profile_id, s.source, NULL::text AS vendor, s.title, s.tags, "
        f"{LATEST_STATUS} AS status, s.created_at, s.updated_at, s.parent_session_id"
    )
    ts = q.arg(f.q) if f.q else ""
    if f.q and hits is not None:
        q.add(f"s.id = ANY({q.arg(hits)}::uuid[])")
    elif f.q:
        source = f"sessions s CROSS JOIN LATERAL (SELECT 1 FROM {_first_match('s.id', ts)}) h"
    if f.profile:
        q.add(f"s.profile_id = {q.arg(f.profile)}")
    if f.source:
        q.add(f"s.source = {q.arg(f.source)}")
    if f.tag:
        q.add(f"s.tags @> ARRAY[{q.arg(f.tag)}]::text[]")
    if f.since:
        q.add(f"s.created_at >= {q.arg(f.since)}")
    if f.until:
        q.add(f"s.created_at < {q.arg(f.until)}")
    if f.status:
        q.add(f"{LATEST_STATUS} = {q.arg(f.status)}")
    if after is not None:
        q.add(f"(s.created_at, s.id) < ({q.arg(after[0])}, {q.arg(after[1])})")
    sql = f"{select} FROM {source}{q.sql()} ORDER BY s.created_at DESC, s.id DESC LIMIT {int(limit)}"
    if f.q:
        # The snippet of each session's first matching message, for this page's rows only.
        sql = (
            f"SELECT p.*, h.snippet FROM ({sql}) p LEFT JOIN LATERAL ("
            f"SELECT ts_headline('english', translate({MESSAGE_TEXT}, E'\\x02\\x03', ''), "
            f"websearch_to_tsquery('english', {ts}), {q.arg(HEADLINE_OPTIONS)}) AS snippet "
            f"FROM {_first_match('p.id', ts)}) h ON true ORDER BY p.created_at DESC, p.id DESC"
        )
    else:
        sql = f"SELECT p.*, NULL::text AS snippet FROM ({sql}) p"
    return sql, q.args


def _imported_query(f: SessionFilters, after: tuple[datetime, uuid.UUID] | None, limit: int) -> tuple[str, list[Any]]:
    q = _Query()
    vendor = (
        "(SELECT v.vendor FROM graph.vendor_ids v WHERE v.session_id = g.id AND v.our_type = 'session' "
        "ORDER BY v.vendor LIMIT 1)"
    )
    q.add("g.started_at IS NOT NULL")
    if f.profile:
        q.add(f"g.profile_id = {q.arg(f.profile)}")
    if f.vendor:
        q.add(
            "EXISTS (SELECT 1 FROM graph.vendor_ids v WHERE v.session_id = g.id AND v.our_type = 'session' "
            f"AND v.vendor = {q.arg(f.vendor)})"
        )
    if f.status:
        q.add(f"g.outcome = {q.arg(f.status)}")
    if f.since:
        q.add(f"g.started_at >= {q.arg(f.since)}")
    if f.until:
        q.add(f"g.started_at < {q.arg(f.until)}")
    if after is not None:
        q.add(f"(g.started_at, g.id) < ({q.arg(after[0])}, {q.arg(after[1])})")
    sql = (
        f"SELECT g.id, 'imported' AS kind, g.profile_id, 'import' AS source, {vendor} AS vendor, g.title, "
        "'{}'::text[] AS tags, g.outcome AS status, g.started_at AS created_at, g.ended_at AS updated_at, "
        f"g.parent_session_id, NULL::text AS snippet FROM graph.sessions g{q.sql()} "
        f"ORDER BY g.started_at DESC, g.id DESC LIMIT {int(limit)}"
    )
    return sql, q.args


def _row(r: Row) -> SessionRow:
    snippet = r["snippet"]
    kind = r["kind"]
    return SessionRow(
        id=r["id"],
        kind=kind,
        profile_id=r["profile_id"],
        source=r["source"],
        vendor=r["vendor"],
        title=r["title"],
        tags=list(r["tags"] or ()),
        status=r["status"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        parent_session_id=r["parent_session_id"],
        snippet=None if snippet is None else snippet.replace(START, "").replace(STOP, ""),
        snippet_html=None if snippet is None else str(highlight(snippet)),
        url=f"/sessions/{r['id']}" if kind == "loop" else f"/imported/{r['id']}",
    )


async def list_sessions(
    conn: Conn, f: SessionFilters, cursor: str | None = None, limit: int = PAGE_SIZE
) -> SessionList:
    after = decode_cursor(cursor) if cursor else None
    loop_wanted = f.kind != "imported" and not f.vendor
    # Imported sessions have no messages (search), tags or loop sources.
    imported_wanted = f.kind != "loop" and not (f.q or f.tag or f.source)
    rows: list[Row] = []
    if loop_wanted:
        hits: list[uuid.UUID] | None = None
        if f.q:
            # Planned for this `q` each time: a generic plan of a prepared statement (asyncpg's, after five runs)
            # computes the tsquery again for every row it checks, and cannot tell a rare word from a common one.
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            probe = await conn.fetchrow(
                "SELECT count(*) AS n, array_agg(DISTINCT x.session_id) AS ids FROM (SELECT m.session_id "
                "FROM messages m WHERE m.search @@ websearch_to_tsquery('english', $1) LIMIT $2) x",
                f.q,
                FEW_HITS,
            )
            if probe is not None and probe["n"] < FEW_HITS:
                hits = list(probe["ids"] or ())
        sql, args = _loop_query(f, after, limit + 1, hits)
        rows += await conn.fetch(sql, *args)
    if imported_wanted:
        sql, args = _imported_query(f, after, limit + 1)
        rows += await conn.fetch(sql, *args)
    rows.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1]["created_at"], page[-1]["id"]) if len(rows) > limit else None
    return SessionList(sessions=[_row(r) for r in page], next_cursor=next_cursor, filters=f)


def parse_time(name: str, raw: str | None) -> datetime | None:
    """An ISO 8601 time with its zone; empty (a form's blank field) is none. 422 for anything else, a time
    that is no time in UTC included (the year 1 east of Greenwich, which PostgreSQL cannot be given)."""
    if raw is None or not raw.strip():
        return None
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise HTTPException(422, f"{name}: not a time (2026-11-01T09:00:00Z)") from None
    if value.tzinfo is None:
        raise HTTPException(422, f"{name}: give a time zone (2026-11-01T09:00:00Z)")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise HTTPException(422, f"{name}: outside the years 1 to 9999 in UTC") from None
    return value


def clean(value: str | None) -> str | None:
    """A filter's text, stripped; blank (a form's empty field) is none."""
    return value.strip() or None if value is not None else None


TIME_HELP: Final = "ISO 8601 with a time zone, e.g. 2026-11-01T09:00:00Z"


def _filters(
    profile: Annotated[str | None, Query(max_length=64)] = None,
    source: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[str | None, Query(max_length=32)] = None,
    tag: Annotated[str | None, Query(max_length=256)] = None,
    vendor: Annotated[str | None, Query(max_length=64)] = None,
    kind: Literal["all", "loop", "imported"] = "all",
    since: Annotated[str | None, Query(max_length=64, description="from this time on; " + TIME_HELP)] = None,
    until: Annotated[str | None, Query(max_length=64, description="before this time; " + TIME_HELP)] = None,
    q: Annotated[str | None, Query(max_length=500, description="full-text search over the messages")] = None,
) -> SessionFilters:
    return SessionFilters(
        profile=clean(profile),
        source=clean(source),
        status=clean(status),
        tag=clean(tag),
        vendor=clean(vendor),
        kind=kind,
        since=parse_time("since", since),
        until=parse_time("until", until),
        q=clean(q),
    )


Filters = Annotated[SessionFilters, Depends(_filters)]
Cursor = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]
Limit = Annotated[int, Query(ge=1, le=200)]


@router.get("/api/sessions", response_model=SessionList)
async def api_sessions(
    who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> SessionList:
    """Sessions, newest first (keyset pages), filtered; with `q`, those with a message matching it."""
    async with db.reader(who.user) as conn:
        return await list_sessions(conn, filters, cursor, limit)


@router.get("/sessions", include_in_schema=False, response_class=HTMLResponse)
async def sessions_page(
    request: Request, who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> HTMLResponse:
    async with db.reader(who.user) as conn:
        page = await list_sessions(conn, filters, cursor, limit)
    query = {k: v for k, v in filters.model_dump(mode="json").items() if v not in (None, "", "all")}
    # snippet_html was escaped before its <mark> tags were added (highlight): it is markup of ours.
    snippets = {s.id: Markup(s.snippet_html) for s in page.sessions if s.snippet_html is not None}
    return render(request, "sessions.html", {"page": page, "f": filters, "query": query, "snippets": snippets})


# One session.


class ToolCallView(BaseModel):
    id: uuid.UUID
    call_id: str
    name: str
    args: dict[str, Any]
    result: str | None
    is_error: bool
    risk: str
    approval: str | None
    decided_by: str | None = None
    decided_at: datetime | None = None
    started_at: datetime
    finished_at: datetime
    duration_ms: float


class ModelCallView(BaseModel):
    id: uuid.UUID
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    latency_s: float | None
    #: Null when the call could not be priced (cost_status "unpriced"): never hidden.
    cost_usd: Decimal | None
    cost_status: str
    created_at: datetime


class ToolCallRequest(BaseModel):
    id: str
    name: str
    args: dict[str, Any]


class MessageView(BaseModel):
    id: uuid.UUID
    seq: int
    #: user, assistant or tool_result (the specification's roles).
    role: str
    text: str | None
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    #: A tool result's call id, and whether the tool failed.
    call_id: str | None = None
    is_error: bool = False
    #: False once compaction replaced it by a summary.
    active: bool
    created_at: datetime


class TurnView(BaseModel):
    id: uuid.UUID
    parent_turn_id: uuid.UUID | None
    depth: int
    status: str
    error: str | None
    tags: list[str]
    started_at: datetime
    finished_at: datetime | None
    messages: list[MessageView]
    tool_calls: list[ToolCallView]
    model_calls: list[ModelCallView]
    #: Sessions this turn delegated to (their turns' parent_turn_id is this turn).
    children: list[SessionView]


class Totals(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    #: The priced calls' cost; `unpriced_calls` were not priced and are not in it.
    cost_usd: Decimal = Decimal(0)
    model_calls: int = 0
    unpriced_calls: int = 0


class SessionView(BaseModel):
    id: uuid.UUID
    profile_id: str
    source: str
    title: str | None
    tags: list[str]
    parent_session_id: uuid.UUID | None
    #: What the first turn's model was given besides the conversation (system prompt, memory), as recorded.
    context_snapshot: dict[str, Any] | None = None
    created_at: datetime
    updated_at: datetime
    status: str | None
    turns: list[TurnView]
    #: Messages recorded outside any turn (none from today's loop; kept so that nothing stored is hidden).
    messages_outside_turns: list[MessageView] = Field(default_factory=list)
    #: Child sessions no turn of this session is known to have delegated to.
    children: list[SessionView]
    #: This session's model calls with those of its children.
    totals: Totals
    #: True when a child deeper than MAX_CHILD_DEPTH or more than MAX_ROWS messages were left out.
    truncated: bool = False


def _message(r: Row) -> MessageView:
    content = r["content"] if isinstance(r["content"], dict) else {}
    role = str(content.get("role") or r["role"])
    text: str | None = None
    calls: list[ToolCallRequest] = []
    call_id: str | None = None
    is_error = False
    if role == "tool_result":
        text = str(content.get("content", ""))
        call_id = str(content.get("call_id", "")) or None
        is_error = bool(content.get("is_error", False))
    else:
        raw_text = content.get("text")
        text = None if raw_text is None else str(raw_text)
        for c in content.get("tool_calls") or ():
            if isinstance(c, dict):
                args = c.get("args")
                calls.append(
                    ToolCallRequest(
                        id=str(c.get("id", "")),
                        name=str(c.get("name", "")),
                        args=args if isinstance(args, dict) else {},
                    )
                )
    return MessageView(
        id=r["id"],
        seq=r["seq"],
        role=role,
        text=text,
        tool_calls=calls,
        call_id=call_id,
        is_error=is_error,
        active=r["active"],
        created_at=r["created_at"],
    )


def _tool_call(r: Row) -> ToolCallView:
    return ToolCallView(
        id=r["id"],
        call_id=r["call_id"],
        name=r["name"],
        args=r["args"] if isinstance(r["args"], dict) else {"value": r["args"]},
        result=r["result"],
        is_error=r["is_error"],
        risk=r["risk"],
        approval=r["approval_status"] or r["approval"],
        decided_by=r["decided_by"],
        decided_at=r["decided_at"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        duration_ms=round((r["finished_at"] - r["started_at"]).total_seconds() * 1000, 3),
    )


def _model_call(r: Row) -> ModelCallView:
    return ModelCallView(
        id=r["event_id"],
        provider=r["provider"],
        model=r["model"],
        input_tokens=r["input_tokens"],
        output_tokens=r["output_tokens"],
        cache_read_tokens=r["cache_read_tokens"],
        cache_write_tokens=r["cache_write_5m_tokens"] + r["cache_write_1h_tokens"],
        reasoning_tokens=r["reasoning_tokens"],
        latency_s=r["latency_s"],
        cost_usd=r["cost_usd"],
        cost_status=r["cost_status"],
        created_at=r["created_at"],
    )


async def load_session(conn: Conn, session_id: uuid.UUID) -> SessionView | None:
    """The session with its delegated descendants, or None when the reader cannot see it."""
    sessions = await conn.fetch(
        """
        WITH RECURSIVE tree AS (
            SELECT s.*, 0 AS level FROM sessions s WHERE s.id = $1
            UNION ALL
            SELECT c.*, t.level + 1 FROM sessions c JOIN tree t ON c.parent_session_id = t.id
            WHERE t.level < $2
        )
        SELECT id, profile_id, source, title, tags, parent_session_id, context_snapshot, created_at, updated_at, level
        FROM tree
        ORDER BY level, created_at, id
        """,
        session_id,
        MAX_CHILD_DEPTH,
    )
    if not sessions:
        return None
    ids = [r["id"] for r in sessions]
    turns = await conn.fetch(
        "SELECT id, session_id, parent_turn_id, depth, status, error, tags, started_at, finished_at FROM turns "
        "WHERE session_id = ANY($1::uuid[]) ORDER BY started_at, id",
        ids,
    )
    messages = await conn.fetch(
        "SELECT id, session_id, turn_id, seq, role, content, active, created_at FROM messages "
        "WHERE session_id = ANY($1::uuid[]) ORDER BY session_id, seq LIMIT $2",
        ids,
        MAX_ROWS,
    )
    turn_ids = [t["id"] for t in turns]
    tool_calls = await conn.fetch(
        "SELECT c.id, c.turn_id, c.call_id, c.name, c.args, c.result, c.is_error, c.risk, c.approval, c.started_at, "
        "c.finished_at, a.status AS approval_status, a.decided_by, a.decided_at "
        "FROM tool_calls c LEFT JOIN approvals a ON a.tool_call_id = c.id "
        "WHERE c.turn_id = ANY($1::uuid[]) ORDER BY c.started_at, c.id LIMIT $2",
        turn_ids,
        MAX_ROWS,
    )
    model_calls = await conn.fetch(
        "SELECT event_id, session_id, turn_id, provider, model, input_tokens, output_tokens, cache_read_tokens, "
        "cache_write_5m_tokens, cache_write_1h_tokens, reasoning_tokens, latency_s, cost_usd, cost_status, "
        "created_at FROM model_calls WHERE session_id = ANY($1::uuid[]) ORDER BY created_at, event_id LIMIT $2",
        ids,
        MAX_ROWS,
    )
    return assemble(sessions, turns, messages, tool_calls, model_calls)


def assemble(
    sessions: Sequence[Row],
    turns: Sequence[Row],
    messages: Sequence[Row],
    tool_calls: Sequence[Row],
    model_calls: Sequence[Row],
) -> SessionView:
    by_turn_messages: dict[uuid.UUID | None, list[MessageView]] = {}
    loose_messages: dict[uuid.UUID, list[MessageView]] = {}
    for m in messages:
        if m["turn_id"] is None:
            loose_messages.setdefault(m["session_id"], []).append(_message(m))
        else:
            by_turn_messages.setdefault(m["turn_id"], []).append(_message(m))
    by_turn_tools: dict[uuid.UUID, list[ToolCallView]] = {}
    for c in tool_calls:
        by_turn_tools.setdefault(c["turn_id"], []).append(_tool_call(c))
    by_turn_models: dict[uuid.UUID | None, list[ModelCallView]] = {}
    session_models: dict[uuid.UUID, list[ModelCallView]] = {}
    for mc in model_calls:
        call = _model_call(mc)
        session_models.setdefault(mc["session_id"], []).append(call)
        by_turn_models.setdefault(mc["turn_id"], []).append(call)

    turn_views: dict[uuid.UUID, TurnView] = {}
    session_turns: dict[uuid.UUID, list[TurnView]] = {}
    turn_session: dict[uuid.UUID, uuid.UUID] = {}
    for t in turns:
        turn = TurnView(
            id=t["id"],
            parent_turn_id=t["parent_turn_id"],
            depth=t["depth"],
            status=t["status"],
            error=t["error"],
            tags=list(t["tags"] or ()),
            started_at=t["started_at"],
            finished_at=t["finished_at"],
            messages=by_turn_messages.get(t["id"], []),
            tool_calls=by_turn_tools.get(t["id"], []),
            model_calls=by_turn_models.get(t["id"], []),
            children=[],
        )
        turn_views[t["id"]] = turn
        turn_session[t["id"]] = t["session_id"]
        session_turns.setdefault(t["session_id"], []).append(turn)

    views: dict[uuid.UUID, SessionView] = {}
    for s in sessions:
        own_turns = session_turns.get(s["id"], [])
        views[s["id"]] = SessionView(
            id=s["id"],
            profile_id=s["profile_id"],
            source=s["source"],
            title=s["title"],
            tags=list(s["tags"] or ()),
            parent_session_id=s["parent_session_id"],
            context_snapshot=s["context_snapshot"] if isinstance(s["context_snapshot"], dict) else None,
            created_at=s["created_at"],
            updated_at=s["updated_at"],
            status=own_turns[-1].status if own_turns else None,
            turns=own_turns,
            messages_outside_turns=loose_messages.get(s["id"], []),
            children=[],
            totals=Totals(),
            truncated=len(messages) >= MAX_ROWS,
        )
    root = views[sessions[0]["id"]]
    # Children under the turn that delegated to them (their first turn's parent_turn_id), else the session.
    for s in sessions[1:]:
        child = views[s["id"]]
        parent = views.get(s["parent_session_id"])
        first = child.turns[0] if child.turns else None
        link = first.parent_turn_id if first is not None else None
        if link is not None and link in turn_views and turn_session[link] == s["parent_session_id"]:
            turn_views[link].children.append(child)
        elif parent is not None:
            parent.children.append(child)
    if len(sessions) and max(s["level"] for s in sessions) >= MAX_CHILD_DEPTH:
        root.truncated = True

    def totals(view: SessionView) -> Totals:
        out = Totals()
        for mc in session_models.get(view.id, []):
            out.input_tokens += mc.input_tokens
            out.output_tokens += mc.output_tokens
            out.model_calls += 1
            if mc.cost_usd is None:
                out.unpriced_calls += 1
            else:
                out.cost_usd += mc.cost_usd
        for child in [*view.children, *(c for t in view.turns for c in t.children)]:
            sub = totals(child)
            out.input_tokens += sub.input_tokens
            out.output_tokens += sub.output_tokens
            out.model_calls += sub.model_calls
            out.unpriced_calls += sub.unpriced_calls
            out.cost_usd += sub.cost_usd
        view.totals = out
        return out

    totals(root)
    return root


TurnView.model_rebuild()
SessionView.model_rebuild()


async def _session_or_404(db: Database, who: SignedIn, session_id: uuid.UUID) -> SessionView:
    async with db.reader(who.user) as conn:
        view = await load_session(conn, session_id)
    if view is None and db.has_replica:
        # Not on the read replica (yet): a session started a moment ago is the primary's alone.
        async with db.reader(who.user, primary=True) as conn:
            view = await load_session(conn, session_id)
    if view is None:
        raise HTTPException(404, f"no session {session_id}")
    return view


@router.get(
    "/api/sessions/{session_id}", response_model=SessionView, responses={404: {"description": "no such session"}}
)
async def api_session(who: SignedIn, db: Db, session_id: uuid.UUID) -> SessionView:
    """One session: its turns, messages, tool calls, model calls and delegated child sessions."""
    return await _session_or_404(db, who, session_id)


@router.get("/sessions/{session_id}", include_in_schema=False, response_class=HTMLResponse)
async def session_page(request: Request, who: SignedIn, db: Db, session_id: uuid.UUID) -> HTMLResponse:
    view = await _session_or_404(db, who, session_id)
    return render(request, "session.html", {"s": view, "timeline": timeline.session_timeline(view)})


# Live: what happens in the session from now on.


async def _visible_profile(db: Database, who: SignedIn, session_id: uuid.UUID) -> str:
    sql = "SELECT profile_id FROM sessions WHERE id = $1"
    async with db.reader(who.user) as conn:
        profile = await conn.fetchval(sql, session_id)
    if profile is None and db.has_replica:
        async with db.reader(who.user, primary=True) as conn:
            profile = await conn.fetchval(sql, session_id)
    if profile is None:
        raise HTTPException(404, f"no session {session_id}")
    return str(profile)


async def _stream(live: Live, subject: str) -> AsyncIterator[dict[str, str]]:
    """Each of the session's events as its JSON, named by its type."""
    LIVE_WATCHERS.inc()
    try:
        async with live.follow(subject) as events:
            yield {"event": "ready", "data": "following"}
            async for event in events:
                if isinstance(event, Overflow):
                    yield {"event": "reload", "data": f"{event.dropped} events were dropped: reload the page"}
                elif not isinstance(event, ApprovalRequest):
                    yield {"event": event_type(event), "data": encode_event(event).decode()}
    finally:
        LIVE_WATCHERS.dec()


def _live(request: Request) -> Live:
    live: Live = request.app.state.live
    if live.nc is None:
        raise HTTPException(503, "the console has no NATS connection (COS_NATS_URL)")
    return live


@router.get("/sessions/{session_id}/live", include_in_schema=False)
async def session_live(request: Request, who: SignedIn, db: Db, session_id: uuid.UUID) -> EventSourceResponse:
    """Server-sent events for the page (pages/timeline.py): `update` (what changed, merged into its turn),
    `reload` (events were dropped)."""
    profile, known = await timeline.known_or_404(db, who, session_id)
    live = _live(request)
    view = timeline.LiveSession(session_id, known)
    return EventSourceResponse(timeline.stream(live, timeline.subjects(profile, session_id), view), ping=15)


@router.get(
    "/api/sessions/{session_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the session's events as they happen"}},
)
async def api_session_events(request: Request, who: SignedIn, db: Db, session_id: uuid.UUID) -> EventSourceResponse:
    """Server-sent events: each of the session's events from now on, named by its type, as its JSON."""
    profile = await _visible_profile(db, who, session_id)
    live = _live(request)
    return EventSourceResponse(_stream(live, session_filter(profile, session_id)), ping=15)

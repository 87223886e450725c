"""Imported work: Claude Code and Codex sessions of the session graph (the `graph` schema the journal-writer
projects from `transcript_imported` events), /imported and /api/imported (the list), /imported/{id} and
/api/imported/{id} (one session).

The list is the Sessions page's own query (`sessions.list_sessions`, kind "imported": keyset pages on
(started_at, id), newest first, or by cost, the same filters and columns: cost billed, models, duration), with
each row's counts from the transcript added for that page only. A session
shows its user inputs in order, and under each its model invocations (tokens), assistant text, tool uses with
their results, and file touches; its subagent sessions; and what billing billed for its tree (the importer
bills a tree's calls to the top-level session, `model_calls.session_id`).

Analysts read as their database role: the graph tables' row-level security (deploy/postgres/roles.sql: a graph
row is visible when its session's profile is granted) decides what exists for them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from commonos.console.auth import SignedIn
from commonos.console.db import Database, get_db
from commonos.console.pages.sessions import (
    COST_WINDOW_DAYS,
    TIME_HELP,
    Cursor,
    Limit,
    SessionFilters,
    SessionId,
    Sort,
    clean,
    decode_cursor,
    list_query,
    list_sessions,
    parse_time,
    sort_queries,
    wider_ranges,
)
from commonos.console.templating import render
from commonos.proto.vendors import VENDORS
from commonos.runtime.postgres import Conn

router = APIRouter(tags=["imported"])

Db = Annotated[Database, Depends(get_db)]

PAGE_SIZE: Final = 50
#: The most rows of each kind (inputs, invocations, tool uses, …) one session page shows.
MAX_ROWS: Final = 5000
#: The most characters of one tool result's output shown (the API too): outputs can be whole files.
MAX_OUTPUT_CHARS: Final = 20_000
OUTCOMES: Final = ("unknown", "interrupted", "committed", "abandoned")


# The list.


class ImportedRow(BaseModel):
    id: uuid.UUID
    vendor: str | None
    profile_id: str | None
    title: str | None
    outcome: str | None
    started_at: datetime
    ended_at: datetime | None
    parent_session_id: uuid.UUID | None
    working_dir: str | None
    git_branch: str | None
    inputs: int
    model_invocations: int
    input_tokens: int
    output_tokens: int
    tool_uses: int
    files_touched: int
    url: str
    #: What billing billed for a top-level session's tree (the importer bills its calls to it): the priced calls'
    #: cost, null when none is priced or for a subagent session (`billed_with_parent`).
    cost_usd: Decimal | None = None
    billed_calls: int = 0
    unpriced_calls: int = 0
    #: The models of the billed calls (a subagent session: of its own invocations).
    models: list[str] = Field(default_factory=list)
    #: From the transcript's first line to its last.
    duration_s: float | None = None
    billed_with_parent: bool = False


class ImportedFilters(BaseModel):
    profile: str | None = None
    vendor: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    sort: Sort = "time"


class ImportedList(BaseModel):
    sessions: list[ImportedRow]
    #: Pass as `cursor` for the next (older, or cheaper) page; null on the last page.
    next_cursor: str | None
    filters: ImportedFilters
    #: Sorted by cost: the start of the range ranked (`since`, else the last COST_WINDOW_DAYS days).
    ranked_since: datetime | None = None


COUNTS_SQL: Final = """
SELECT g.id, g.working_dir, g.git_branch,
       (SELECT count(*) FROM graph.user_inputs u WHERE u.session_id = g.id) AS inputs,
       (SELECT count(*) FROM graph.model_invocations m WHERE m.session_id = g.id) AS model_invocations,
       (SELECT coalesce(sum(m.input_tokens), 0) FROM graph.model_invocations m WHERE m.session_id = g.id)
           AS input_tokens,
       (SELECT coalesce(sum(m.output_tokens), 0) FROM graph.model_invocations m WHERE m.session_id = g.id)
           AS output_tokens,
       (SELECT count(*) FROM graph.tool_uses t WHERE t.session_id = g.id) AS tool_uses,
       (SELECT count(DISTINCT f.path) FROM graph.file_touches f WHERE f.session_id = g.id) AS files_touched
FROM graph.sessions g WHERE g.id = ANY($1::uuid[])
"""


async def list_imported(
    conn: Conn, f: ImportedFilters, cursor: str | None = None, limit: int = PAGE_SIZE
) -> ImportedList:
    if cursor:
        decode_cursor(cursor, f.sort)  # a 422 for a cursor of no list
    page = await list_sessions(
        conn,
        SessionFilters(
            kind="imported",
            profile=f.profile,
            vendor=f.vendor,
            status=f.outcome,
            since=f.since,
            until=f.until,
            sort=f.sort,
        ),
        cursor,
        limit,
    )
    ids = [s.id for s in page.sessions]
    counts = {r["id"]: r for r in await conn.fetch(COUNTS_SQL, ids)} if ids else {}
    rows: list[ImportedRow] = []
    for s in page.sessions:
        c = counts.get(s.id)
        rows.append(
            ImportedRow(
                id=s.id,
                vendor=s.vendor,
                profile_id=s.profile_id,
                title=s.title,
                outcome=s.status,
                started_at=s.created_at,
                ended_at=s.updated_at,
                parent_session_id=s.parent_session_id,
                working_dir=c["working_dir"] if c else None,
                git_branch=c["git_branch"] if c else None,
                inputs=c["inputs"] if c else 0,
                model_invocations=c["model_invocations"] if c else 0,
                input_tokens=int(c["input_tokens"]) if c else 0,
                output_tokens=int(c["output_tokens"]) if c else 0,
                tool_uses=c["tool_uses"] if c else 0,
                files_touched=c["files_touched"] if c else 0,
                url=f"/imported/{s.id}",
                cost_usd=s.cost_usd,
                billed_calls=0 if s.billed_with_parent else s.model_calls,
                unpriced_calls=s.unpriced_calls,
                models=s.models,
                duration_s=s.duration_s,
                billed_with_parent=s.billed_with_parent,
            )
        )
    return ImportedList(sessions=rows, next_cursor=page.next_cursor, filters=f, ranked_since=page.ranked_since)


def _filters(
    profile: Annotated[str | None, Query(max_length=64)] = None,
    vendor: Annotated[str | None, Query(max_length=64, description="claude-code or codex")] = None,
    outcome: Annotated[str | None, Query(max_length=32, description=", ".join(OUTCOMES))] = None,
    since: Annotated[str | None, Query(max_length=64, description="started at or after; " + TIME_HELP)] = None,
    until: Annotated[str | None, Query(max_length=64, description="started before; " + TIME_HELP)] = None,
    sort: Annotated[
        Sort,
        Query(
            description="time: newest first; cost: the most expensive first, among the sessions started from "
            f"`since` on (without it, the last {COST_WINDOW_DAYS} days)"
        ),
    ] = "time",
) -> ImportedFilters:
    return ImportedFilters(
        profile=clean(profile),
        vendor=clean(vendor),
        outcome=clean(outcome),
        since=parse_time("since", since),
        until=parse_time("until", until),
        sort=sort,
    )


Filters = Annotated[ImportedFilters, Depends(_filters)]


@router.get("/api/imported", response_model=ImportedList)
async def api_imported(
    who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> ImportedList:
    """Imported Claude Code and Codex sessions, newest first or the most expensive first (keyset pages), with
    their counts, what billing billed for them, their models and duration."""
    async with db.reader(who.user) as conn:
        return await list_imported(conn, filters, cursor, limit)


@router.get("/imported", include_in_schema=False, response_class=HTMLResponse)
async def imported_page(
    request: Request, who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> HTMLResponse:
    async with db.reader(who.user) as conn:
        page = await list_imported(conn, filters, cursor, limit)
    query = list_query(filters)
    return render(
        request,
        "imported.html",
        {
            "page": page,
            "f": filters,
            "query": query,
            "vendors": VENDORS,
            "outcomes": OUTCOMES,
            "wider": wider_ranges(query),
            "sort_queries": sort_queries(query),
            "cost_window_days": COST_WINDOW_DAYS,
        },
    )


# One session.


class InvocationView(BaseModel):
    id: uuid.UUID
    parent_model_invocation_id: uuid.UUID | None
    model: str | None
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int | None
    cache_read_tokens: int
    cache_write_tokens: int
    total_tokens: int
    token_basis: str | None
    speed: str | None
    stop_reason: str | None
    started_at: datetime | None


class AssistantTextView(BaseModel):
    id: uuid.UUID
    model_invocation_id: uuid.UUID
    text: str | None
    timestamp: datetime | None


class ToolResultView(BaseModel):
    status: str
    output_text: str | None
    #: The structured output, when the vendor recorded one.
    output: Any = None
    error_text: str | None
    timestamp: datetime | None
    #: output_text was longer than MAX_OUTPUT_CHARS and is cut.
    truncated: bool = False


class FileTouchView(BaseModel):
    path: str
    kind: str
    start_line: int | None
    end_line: int | None
    #: How many diff hunks an edit recorded.
    hunks: int
    tool_use_id: uuid.UUID | None


class ToolUseView(BaseModel):
    id: uuid.UUID
    model_invocation_id: uuid.UUID
    name: str
    verb: str
    input: Any
    status: str
    timestamp: datetime | None
    result: ToolResultView | None
    files: list[FileTouchView]
    #: The subagent session this tool use spawned.
    spawned_session_id: uuid.UUID | None = None


class InputView(BaseModel):
    id: uuid.UUID
    ordinal: int
    text: str
    kind: str
    origin: str
    interrupted: bool
    triggered_at: datetime | None
    model_invocations: list[InvocationView]
    assistant_messages: list[AssistantTextView]
    tool_uses: list[ToolUseView]
    #: File touches of this input that no tool use names.
    files: list[FileTouchView]


class TokenTotals(BaseModel):
    model_invocations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class BilledCost(BaseModel):
    """What billing billed for the session's tree (its calls are billed to the top-level session)."""

    calls: int
    #: Exact USD of the priced calls; null when none has a price.
    usd: Decimal | None
    unpriced_calls: int


class ChildView(BaseModel):
    id: uuid.UUID
    title: str | None
    outcome: str
    started_at: datetime | None
    spawned_by_tool_use_id: uuid.UUID | None


class VendorIdView(BaseModel):
    vendor: str
    kind: str
    value: str


class ImportedSessionView(BaseModel):
    id: uuid.UUID
    vendor: str | None
    profile_id: str | None
    title: str | None
    outcome: str
    started_at: datetime | None
    ended_at: datetime | None
    working_dir: str | None
    git_branch: str | None
    repo_root: str | None
    parent_session_id: uuid.UUID | None
    spawned_by_tool_use_id: uuid.UUID | None
    vendor_ids: list[VendorIdView]
    attributes: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputView]
    children: list[ChildView]
    #: Every file the session touched (read or edited), once per path and kind.
    files: list[FileTouchView]
    totals: TokenTotals
    #: The top-level session only: what billing billed for the tree; null for a subagent session.
    billed: BilledCost | None
    #: More than MAX_ROWS rows of a kind were left out.
    truncated: bool = False


def _touch(r: Any) -> FileTouchView:
    hunks = r["hunks"]
    return FileTouchView(
        path=r["path"],
        kind=r["kind"],
        start_line=r["start_line"],
        end_line=r["end_line"],
        hunks=len(hunks) if isinstance(hunks, list) else 0,
        tool_use_id=r["tool_use_id"],
    )


async def load_imported(conn: Conn, session_id: uuid.UUID) -> ImportedSessionView | None:
    """The session as the reader may see it, or None."""
    s = await conn.fetchrow(
        "SELECT id, profile_id, title, outcome, started_at, ended_at, working_dir, git_branch, repo_root, "
        "parent_session_id, spawned_by_tool_use_id FROM graph.sessions WHERE id = $1",
        session_id,
    )
    if s is None:
        return None
    vendor_ids = await conn.fetch(
        "SELECT vendor, vendor_id_kind, vendor_id FROM graph.vendor_ids WHERE session_id = $1 AND our_type = 'session' "
        "AND our_id = $1 ORDER BY vendor, vendor_id_kind",
        session_id,
    )
    attributes = await conn.fetch(
        "SELECT DISTINCT ON (key) key, value FROM graph.session_attributes WHERE session_id = $1 "
        "ORDER BY key, valid_from DESC",
        session_id,
    )
    inputs = await conn.fetch(
        "SELECT id, ordinal, text, kind, origin, interrupted, triggered_at FROM graph.user_inputs "
        "WHERE session_id = $1 ORDER BY ordinal LIMIT $2",
        session_id,
        MAX_ROWS,
    )
    invocations = await conn.fetch(
        "SELECT id, user_input_id, parent_model_invocation_id, model, input_tokens, output_tokens, reasoning_tokens, "
        "cache_read_tokens, cache_write_tokens, total_tokens, token_basis, speed, stop_reason, started_at "
        "FROM graph.model_invocations WHERE session_id = $1 ORDER BY started_at NULLS LAST, id LIMIT $2",
        session_id,
        MAX_ROWS,
    )
    messages = await conn.fetch(
        'SELECT id, user_input_id, model_invocation_id, text, "timestamp" FROM graph.assistant_messages '
        'WHERE session_id = $1 ORDER BY "timestamp" NULLS LAST, id LIMIT $2',
        session_id,
        MAX_ROWS,
    )
    tools = await conn.fetch(
        'SELECT t.id, t.user_input_id, t.model_invocation_id, t.name, t.verb, t.input, t.status, t."timestamp", '
        "r.status AS r_status, left(r.output_text, $3) AS r_output_text, "
        "length(r.output_text) > $3 AS r_truncated, r.output AS r_output, r.error_text AS r_error_text, "
        'r."timestamp" AS r_timestamp, r.id AS r_id, '
        "(SELECT c.id FROM graph.sessions c WHERE c.spawned_by_tool_use_id = t.id LIMIT 1) AS spawned "
        "FROM graph.tool_uses t LEFT JOIN graph.tool_results r ON r.tool_use_id = t.id "
        'WHERE t.session_id = $1 ORDER BY t."timestamp" NULLS LAST, t.id LIMIT $2',
        session_id,
        MAX_ROWS,
        MAX_OUTPUT_CHARS,
    )
    touches = await conn.fetch(
        "SELECT tool_use_id, user_input_id, path, kind, start_line, end_line, hunks FROM graph.file_touches "
        "WHERE session_id = $1 ORDER BY path, kind, id LIMIT $2",
        session_id,
        MAX_ROWS,
    )
    children = await conn.fetch(
        "SELECT id, title, outcome, started_at, spawned_by_tool_use_id FROM graph.sessions "
        "WHERE parent_session_id = $1 ORDER BY started_at NULLS LAST, id LIMIT $2",
        session_id,
        MAX_ROWS,
    )
    billed: BilledCost | None = None
    if s["parent_session_id"] is None:
        row = await conn.fetchrow(
            "SELECT count(*) AS calls, sum(cost_usd) AS usd, count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced "
            "FROM model_calls WHERE session_id = $1",
            session_id,
        )
        if row is not None:
            billed = BilledCost(calls=row["calls"], usd=row["usd"], unpriced_calls=row["unpriced"])

    touches_by_tool: dict[uuid.UUID, list[FileTouchView]] = {}
    loose_touches: dict[uuid.UUID, list[FileTouchView]] = {}
    for t in touches:
        if t["tool_use_id"] is not None:
            touches_by_tool.setdefault(t["tool_use_id"], []).append(_touch(t))
        else:
            loose_touches.setdefault(t["user_input_id"], []).append(_touch(t))
    by_input_inv: dict[uuid.UUID, list[InvocationView]] = {}
    totals = TokenTotals()
    for m in invocations:
        view = InvocationView(**{k: m[k] for k in InvocationView.model_fields})
        by_input_inv.setdefault(m["user_input_id"], []).append(view)
        totals.model_invocations += 1
        totals.input_tokens += m["input_tokens"]
        totals.output_tokens += m["output_tokens"]
        totals.cache_read_tokens += m["cache_read_tokens"]
        totals.cache_write_tokens += m["cache_write_tokens"]
    by_input_msg: dict[uuid.UUID, list[AssistantTextView]] = {}
    for a in messages:
        by_input_msg.setdefault(a["user_input_id"], []).append(
            AssistantTextView(
                id=a["id"], model_invocation_id=a["model_invocation_id"], text=a["text"], timestamp=a["timestamp"]
            )
        )
    by_input_tool: dict[uuid.UUID, list[ToolUseView]] = {}
    for t in tools:
        result = None
        if t["r_id"] is not None:
            result = ToolResultView(
                status=t["r_status"],
                output_text=t["r_output_text"],
                output=t["r_output"],
                error_text=t["r_error_text"],
                timestamp=t["r_timestamp"],
                truncated=bool(t["r_truncated"]),
            )
        by_input_tool.setdefault(t["user_input_id"], []).append(
            ToolUseView(
                id=t["id"],
                model_invocation_id=t["model_invocation_id"],
                name=t["name"],
                verb=t["verb"],
                input=t["input"],
                status=t["status"],
                timestamp=t["timestamp"],
                result=result,
                files=touches_by_tool.get(t["id"], []),
                spawned_session_id=t["spawned"],
            )
        )
    input_views = [
        InputView(
            id=i["id"],
            ordinal=i["ordinal"],
            text=i["text"],
            kind=i["kind"],
            origin=i["origin"],
            interrupted=i["interrupted"],
            triggered_at=i["triggered_at"],
            model_invocations=by_input_inv.get(i["id"], []),
            assistant_messages=by_input_msg.get(i["id"], []),
            tool_uses=by_input_tool.get(i["id"], []),
            files=loose_touches.get(i["id"], []),
        )
        for i in inputs
    ]
    vendor = vendor_ids[0]["vendor"] if vendor_ids else None
    return ImportedSessionView(
        id=s["id"],
        vendor=vendor,
        profile_id=s["profile_id"],
        title=s["title"],
        outcome=s["outcome"],
        started_at=s["started_at"],
        ended_at=s["ended_at"],
        working_dir=s["working_dir"],
        git_branch=s["git_branch"],
        repo_root=s["repo_root"],
        parent_session_id=s["parent_session_id"],
        spawned_by_tool_use_id=s["spawned_by_tool_use_id"],
        vendor_ids=[
            VendorIdView(vendor=v["vendor"], kind=v["vendor_id_kind"], value=v["vendor_id"]) for v in vendor_ids
        ],
        attributes={a["key"]: a["value"] for a in attributes},
        inputs=input_views,
        children=[ChildView(**dict(c)) for c in children],
        files=[_touch(t) for t in touches],
        totals=totals,
        billed=billed,
        truncated=any(len(rows) >= MAX_ROWS for rows in (inputs, invocations, messages, tools, touches)),
    )


async def _imported_or_404(db: Database, who: SignedIn, session_id: uuid.UUID) -> ImportedSessionView:
    async with db.reader(who.user) as conn:
        view = await load_imported(conn, session_id)
    if view is None:
        raise HTTPException(404, f"no imported session {session_id}")
    return view


@router.get(
    "/api/imported/{session_id}",
    response_model=ImportedSessionView,
    responses={404: {"description": "no such imported session"}},
)
async def api_imported_session(who: SignedIn, db: Db, session_id: SessionId) -> ImportedSessionView:
    """One imported session: its inputs, model invocations (tokens), assistant text, tool uses and results, file
    touches, subagent sessions, and what billing billed for it."""
    return await _imported_or_404(db, who, session_id)


#: What each outcome means (commonos.importer.builder labels a session's end from its transcript): shown beside
#: the value and as its title, so that `unknown` reads as the outcome field's value, not as a missing page.
OUTCOME_HELP: Final = {
    "unknown": "the transcript does not say how the session ended (no commit, interruption or unanswered prompt)",
    "committed": "a shell command of the session ran `git commit` and succeeded",
    "interrupted": "its last input was interrupted, or was an interruption",
    "abandoned": "its last prompt never got a model reply",
}
#: An input with more tool uses than this shows them folded, behind a count by tool.
TOOL_USES_SHOWN: Final = 3
#: A session that touched more files than this lists them folded.
FILES_SHOWN: Final = 12


def tool_counts(tool_uses: list[ToolUseView]) -> str:
    """`Read ×12 · Edit ×3`: the tools an input used, most used first."""
    counts = Counter(t.name for t in tool_uses)
    return " · ".join(f"{name} ×{n}" for name, n in counts.most_common())


@router.get("/imported/{session_id}", include_in_schema=False, response_class=HTMLResponse)
async def imported_session_page(request: Request, who: SignedIn, db: Db, session_id: SessionId) -> HTMLResponse:
    view = await _imported_or_404(db, who, session_id)
    return render(
        request,
        "imported_session.html",
        {
            "s": view,
            "outcome_help": OUTCOME_HELP,
            "tool_counts": tool_counts,
            "TOOL_USES_SHOWN": TOOL_USES_SHOWN,
            "FILES_SHOWN": FILES_SHOWN,
        },
    )

"""Sessions: the list (/sessions, /api/sessions) and one session (/sessions/{id}, /api/sessions/{id}), live.

The list pages by keyset on (created_at, id), newest first: the loop's sessions (index sessions_created) and
the imported Claude Code and Codex sessions of the session graph (graph.sessions, by started_at), merged.
Filters: profile, source (the loop's), status (the latest turn's; an imported session's outcome), tag (the
loop's, its profile's included), vendor (imported only), a time range, and `q`: full-text search over the
messages' `search` column and the graph's user inputs' and assistant messages' (then only the sessions with a
match, each with a highlighted snippet of its first match).

Each row carries billing's model calls of the session with those of its delegated sessions (an imported
top-level session: its tree's, which the importer bills to it), their cost, tokens and models, and its
duration, computed for the page's rows only. `sort=cost` ranks by that cost the sessions started in a range
(`since`, else the last COST_WINDOW_DAYS days), over the calls from the range's start on: keyset on (cost,
created_at, id), each session's cost read from billing's per-session totals (`session_costs`, one row a session
with a call in the range: no call is read), exact as summing the calls (`_range_cost`).

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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

import asyncpg
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
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

#: How the list is ordered: newest first, or the most expensive first (then newest).
Sort = Literal["time", "cost"]
#: Sorted by cost without `since`, the list ranks the sessions started in this many days up to now: ranking
#: reads a row of billing's `session_costs` for each session of the range, so the range bounds the work. The
#: page says so, with links to look further back.
COST_WINDOW_DAYS: Final = 7
#: A call is counted with a session from this long before the session's own start: producers' clocks differ a
#: little. The bound lets PostgreSQL skip the months of model_calls and turns before it.
CLOCK_SLACK: Final = "interval '1 day'"


class SessionRow(BaseModel):
    id: uuid.UUID
    kind: Literal["loop", "imported"]
    profile_id: str | None
    source: str
    vendor: str | None = None
    title: str | None
    #: The loop's: the profile's tags with the session's own (what its turns carry, as a child's copy shows).
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
    #: Billing's model calls of the session and of the sessions it delegated to, at any depth (an imported
    #: top-level session: its whole tree, which the importer bills to it). The priced calls' cost; null when
    #: none of its calls is priced, or for an imported subagent session (`billed_with_parent`).
    cost_usd: Decimal | None = None
    unpriced_calls: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    #: The models of those calls, by name.
    models: list[str] = Field(default_factory=list)
    #: From its first turn's start to its last turn's end (imported: the transcript's first and last line).
    duration_s: float | None = None
    #: An imported subagent session: its calls are billed with its top-level session's; calls, tokens and models
    #: here are the transcript's own invocations.
    billed_with_parent: bool = False


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
    sort: Sort = "time"


class SessionList(BaseModel):
    sessions: list[SessionRow]
    #: Pass as `cursor` for the next (older, or cheaper) page; null on the last page.
    next_cursor: str | None
    filters: SessionFilters
    #: Sorted by cost: the start of the range ranked (`since`, else COST_WINDOW_DAYS before now).
    ranked_since: datetime | None = None


def encode_cursor(created_at: datetime, session_id: uuid.UUID, cost: Decimal | None = None) -> str:
    """A keyset cursor: (created_at, id), or by cost (cost, created_at, id)."""
    key: list[str] = [created_at.isoformat(), str(session_id)]
    if cost is not None:
        key.insert(0, str(cost))
    raw = json.dumps(key).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: A cursor's cost: bounded and at billing's scale, so that PostgreSQL takes it as a numeric.
MAX_COST: Final = Decimal(10) ** 28
COST_QUANTUM: Final = Decimal("1e-10")


@dataclass(frozen=True)
class Position:
    """Where a page starts: after this session in the list's order."""

    created_at: datetime
    id: uuid.UUID
    #: Sorted by cost: the session's ranked cost.
    cost: Decimal | None = None


def decode_cursor(cursor: str, sort: Sort = "time") -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
        if not isinstance(key, list) or len(key) != (3 if sort == "cost" else 2):
            raise ValueError("another list's cursor")
        cost = Decimal(key.pop(0)) if sort == "cost" else None
        if cost is not None:
            if not cost.is_finite() or abs(cost) >= MAX_COST:
                raise ValueError("cost")
            cost = cost.quantize(COST_QUANTUM)  # the scale billing keeps (model_calls.cost_usd)
        when, sid = key
        at = datetime.fromisoformat(when)
        if at.tzinfo is None:
            raise ValueError("naive")
        return Position(at, uuid.UUID(sid), cost)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, ArithmeticError):
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


#: A loop session's turns: each month of `turns` before the session's start is skipped.
_OWN_TURNS: Final = f"turns t WHERE t.session_id = s.id AND t.started_at >= s.created_at - {CLOCK_SLACK}"
LATEST_STATUS: Final = f"(SELECT t.status FROM {_OWN_TURNS} ORDER BY t.started_at DESC LIMIT 1)"
LOOP_DURATION: Final = (
    "(SELECT extract(epoch FROM max(coalesce(t.finished_at, t.started_at)) - min(t.started_at))::float8 "
    f"FROM {_OWN_TURNS})"
)
#: The profile's tags with the session's own, sorted, once each (as a turn's tags are made).
LOOP_TAGS: Final = (
    "ARRAY(SELECT DISTINCT x FROM unnest(s.tags || coalesce((SELECT p.tags FROM profiles p "
    "WHERE p.id = s.profile_id), '{}')) AS x ORDER BY x)"
)
#: A tag, of the session or of its profile.
LOOP_TAG_FILTER: Final = (
    "(s.tags @> ARRAY[{0}]::text[] OR s.profile_id IN (SELECT p.id FROM profiles p WHERE p.tags @> ARRAY[{0}]::text[]))"
)


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


def _graph_match(session: str, ts: str) -> str:
    """An imported session's first matching text: its inputs in order, then the assistant's messages in order,
    each read by its session index and filtered (OFFSET 0, as in `_first_match`)."""
    tsq = f"websearch_to_tsquery('english', {ts})"
    return (
        "(SELECT x.text FROM ("
        f"(SELECT u.text FROM (SELECT u.ordinal, u.text, u.search FROM graph.user_inputs u "
        f"WHERE u.session_id = {session} ORDER BY u.ordinal OFFSET 0) u WHERE u.search @@ {tsq} "
        "ORDER BY u.ordinal LIMIT 1) "
        "UNION ALL "
        f'(SELECT a.text FROM (SELECT a.id, a."timestamp", a.text, a.search FROM graph.assistant_messages a '
        f"WHERE a.session_id = {session} OFFSET 0) a WHERE a.search @@ {tsq} "
        'ORDER BY a."timestamp" NULLS LAST, a.id LIMIT 1)'
        ") x LIMIT 1)"
    )


def _after(order: str, at: Position, q: _Query, cost: str) -> str:
    """The keyset condition: rows after `at` in the list's order (`order`: time or cost)."""
    if order == "cost":
        return f"({cost}, {{t}}, {{id}}) < ({q.arg(at.cost)}::numeric, {q.arg(at.created_at)}, {q.arg(at.id)})"
    return f"({{t}}, {{id}}) < ({q.arg(at.created_at)}, {q.arg(at.id)})"


#: A `session_costs` row ({c}) with a call in the range ({w} its start): the others rank with no cost. Their
#: index (`session_costs_last_call`) reads the rows of the range, not every session billing has seen.
IN_RANGE: Final = f"{{c}}.last_call_at >= {{w}}::timestamptz - {CLOCK_SLACK}"


def _range_cost(c: str, w: str) -> str:
    """A session's cost over its calls from `w` - CLOCK_SLACK on, from its row `c` of billing's `session_costs`:
    the whole sum when its first call is in that range (every call then is), else its calls in the range summed
    (a call more than the slack before the start of a session started in the range: a producer's clock far
    off, which is rare; the session's calls only, by model_calls' session index)."""
    return (
        f"CASE WHEN {c}.first_call_at >= {w}::timestamptz - {CLOCK_SLACK} THEN {c}.usd "
        f"ELSE (SELECT coalesce(sum(m.cost_usd), 0) FROM model_calls m WHERE m.session_id = {c}.session_id "
        f"AND m.created_at >= {w}::timestamptz - {CLOCK_SLACK}) END"
    )


def _loop_ranked() -> str:
    """The cost of each loop session's delegated sessions (any depth up to MAX_CHILD_DEPTH) by ancestor, over the
    calls from `since` - CLOCK_SLACK on: `descendants(ancestor, usd)`. {w} is the range's parameter.

    A session's own cost is its row of billing's `session_costs` (one row a session, kept equal to the sums of
    model_calls by billing, `_range_cost`): the ranked sessions' own rows are joined to them (`LOOP_RANK`), their
    descendants' (those started from `since` on, the only ones added to a ranked parent) summed here. No call
    is read, however many the range holds."""
    return f"""
WITH RECURSIVE up AS (
    SELECT c.id AS session_id, c.parent_session_id AS ancestor, 1 AS level FROM sessions c
    WHERE c.parent_session_id IS NOT NULL AND c.created_at >= {{w}}
    UNION ALL
    SELECT up.session_id, p.parent_session_id, up.level + 1 FROM up JOIN sessions p ON p.id = up.ancestor
    WHERE p.parent_session_id IS NOT NULL AND up.level < {MAX_CHILD_DEPTH}
), descendants AS (
    SELECT up.ancestor, sum((SELECT {_range_cost("c", "{w}")} FROM session_costs c WHERE c.session_id = up.session_id))
           AS usd
    FROM up GROUP BY up.ancestor
)"""


#: A loop session's rank: its own calls' cost (its `session_costs` row c) and its descendants' (d).
LOOP_RANK: Final = f"coalesce({_range_cost('c', '{w}')}, 0) + coalesce(d.usd, 0)"


def _loop_query(
    f: SessionFilters,
    after: Position | None,
    limit: int,
    hits: list[uuid.UUID] | None = None,
    since: datetime | None = None,
) -> tuple[str, list[Any]]:
    """The loop's sessions; with `q`, those with a matching message, each with its first match's snippet.

    `hits` (with `q`): every session with a match, when they were few; the page comes from them, looked up by id.
    Without it, from the newest sessions, each checked in seq order until a message matches. The search's
    statements are planned for their own `q` (plan_cache_mode, see list_sessions): the tsquery is computed
    once, when planning, and a rare word's estimate is its own. Sorted by cost: the sessions started from
    `since` on, ranked by `_loop_ranked`; with a common word (no `hits`), checked in rank order until the page
    is full.
    """
    q = _Query()
    by_cost = f.sort == "cost"
    prefix = ""
    source = "sessions s"
    rank = "NULL::numeric"
    if by_cost:
        w = q.arg(since)
        prefix = _loop_ranked().replace("{w}", w)
        source = (
            f"sessions s LEFT JOIN session_costs c ON c.session_id = s.id AND {IN_RANGE.format(c='c', w=w)} "
            "LEFT JOIN descendants d ON d.ancestor = s.id"
        )
        rank = LOOP_RANK.replace("{w}", w)
        q.add(f"s.created_at >= {w}")
    columns = (
        "s.id, 'loop' AS kind, s.profile_id, s.source, NULL::text AS vendor, s.title, "
        f"{LOOP_TAGS} AS tags, {LATEST_STATUS} AS status, s.created_at, s.updated_at, s.parent_session_id, "
        f"{LOOP_DURATION} AS duration_s"
    )
    ts = q.arg(f.q) if f.q else ""
    # A common word sorted by cost: the ranked sessions are checked in rank order until the page is full (below).
    walk_ranked = bool(f.q) and by_cost and hits is None
    if f.q and hits is not None:
        q.add(f"s.id = ANY({q.arg(hits)}::uuid[])")
    elif walk_ranked:
        pass
    elif f.q:
        source = f"sessions s CROSS JOIN LATERAL (SELECT 1 FROM {_first_match('s.id', ts)}) h"
    if f.profile:
        q.add(f"s.profile_id = {q.arg(f.profile)}")
    if f.source:
        q.add(f"s.source = {q.arg(f.source)}")
    if f.tag:
        q.add(LOOP_TAG_FILTER.format(q.arg(f.tag)))
    if f.since and not by_cost:
        q.add(f"s.created_at >= {q.arg(f.since)}")
    if f.until:
        q.add(f"s.created_at < {q.arg(f.until)}")
    if f.status:
        status = q.arg(f.status)
        if f.status != "completed":
            # Only a session with a turn of that status can have it as its latest: those few (from the
            # `turns_not_completed` index, which the literal lets the planner use) are all that are checked.
            q.add(f"s.id IN (SELECT t.session_id FROM turns t WHERE t.status = {status} AND t.status <> 'completed')")
        q.add(f"{LATEST_STATUS} = {status}")
    if after is not None:
        q.add(_after(f.sort, after, q, rank).format(t="s.created_at", id="s.id"))
    if walk_ranked:
        # Every session of the range ranked (OFFSET 0 keeps the match check out of the sort), then each checked
        # in that order until `limit` match: a common word matches within the first few, instead of checking
        # every session of the range before ranking them.
        ranked = (
            f"{prefix} SELECT k.id, k.rank_usd FROM (SELECT s.id, {rank} AS rank_usd, s.created_at FROM {source}"
            f"{q.sql()} ORDER BY rank_usd DESC, s.created_at DESC, s.id DESC OFFSET 0) k "
            f"WHERE EXISTS (SELECT 1 FROM {_first_match('k.id', ts)}) "
            f"ORDER BY k.rank_usd DESC, k.created_at DESC, k.id DESC LIMIT {int(limit)}"
        )
        sql = f"SELECT {columns}, k.rank_usd FROM ({ranked}) k JOIN sessions s ON s.id = k.id"
    elif by_cost:
        # The page's sessions by their rank first; their other columns (subqueries each) for those rows only.
        ranked = (
            f"{prefix} SELECT s.id, {rank} AS rank_usd FROM {source}{q.sql()} "
            f"ORDER BY rank_usd DESC, s.created_at DESC, s.id DESC LIMIT {int(limit)}"
        )
        sql = f"SELECT {columns}, k.rank_usd FROM ({ranked}) k JOIN sessions s ON s.id = k.id"
    else:
        sql = (
            f"SELECT {columns}, NULL::numeric AS rank_usd FROM {source}{q.sql()} "
            f"ORDER BY s.created_at DESC, s.id DESC LIMIT {int(limit)}"
        )
    outer = "p.rank_usd DESC, p.created_at DESC, p.id DESC" if by_cost else "p.created_at DESC, p.id DESC"
    if f.q:
        # The snippet of each session's first matching message, for this page's rows only.
        sql = (
            f"SELECT p.*, h.snippet FROM ({sql}) p LEFT JOIN LATERAL ("
            f"SELECT ts_headline('english', translate({MESSAGE_TEXT}, E'\\x02\\x03', ''), "
            f"websearch_to_tsquery('english', {ts}), {q.arg(HEADLINE_OPTIONS)}) AS snippet "
            f"FROM {_first_match('p.id', ts)}) h ON true ORDER BY {outer}"
        )
    else:
        sql = f"SELECT p.*, NULL::text AS snippet FROM ({sql}) p ORDER BY {outer}"
    return sql, q.args


def _imported_query(
    f: SessionFilters,
    after: Position | None,
    limit: int,
    hits: list[uuid.UUID] | None = None,
    since: datetime | None = None,
) -> tuple[str, list[Any]]:
    """The imported sessions (graph.sessions); with `q`, those whose inputs or assistant text match (`hits`,
    or each of the newest checked, as for the loop's). Sorted by cost: a top-level session's billed calls (its
    tree's), from `since` on."""
    q = _Query()
    by_cost = f.sort == "cost"
    vendor = (
        "(SELECT v.vendor FROM graph.vendor_ids v WHERE v.session_id = g.id AND v.our_type = 'session' "
        "ORDER BY v.vendor LIMIT 1)"
    )
    source = "graph.sessions g"
    rank = "NULL::numeric"
    q.add("g.started_at IS NOT NULL")
    if by_cost:
        w = q.arg(since)
        # The tree's calls are billed to its top-level session: that session's row of `session_costs`.
        source = (
            "graph.sessions g LEFT JOIN session_costs c ON c.session_id = g.id AND g.parent_session_id IS NULL "
            f"AND {IN_RANGE.format(c='c', w=w)}"
        )
        rank = f"coalesce({_range_cost('c', w)}, 0)"
        q.add(f"g.started_at >= {w}")
    ts = q.arg(f.q) if f.q else ""
    if f.q and hits is not None:
        q.add(f"g.id = ANY({q.arg(hits)}::uuid[])")
    elif f.q:
        q.add(f"EXISTS {_graph_match('g.id', ts)}")
    if f.profile:
        q.add(f"g.profile_id = {q.arg(f.profile)}")
    if f.vendor:
        q.add(
            "EXISTS (SELECT 1 FROM graph.vendor_ids v WHERE v.session_id = g.id AND v.our_type = 'session' "
            f"AND v.vendor = {q.arg(f.vendor)})"
        )
    if f.status:
        q.add(f"g.outcome = {q.arg(f.status)}")
    if f.since and not by_cost:
        q.add(f"g.started_at >= {q.arg(f.since)}")
    if f.until:
        q.add(f"g.started_at < {q.arg(f.until)}")
    if after is not None:
        q.add(_after(f.sort, after, q, rank).format(t="g.started_at", id="g.id"))
    columns = (
        f"g.id, 'imported' AS kind, g.profile_id, 'import' AS source, {vendor} AS vendor, g.title, "
        "'{}'::text[] AS tags, g.outcome AS status, g.started_at AS created_at, g.ended_at AS updated_at, "
        "g.parent_session_id, extract(epoch FROM g.ended_at - g.started_at)::float8 AS duration_s"
    )
    if by_cost:
        ranked = (
            f"SELECT g.id, {rank} AS rank_usd FROM {source}{q.sql()} "
            f"ORDER BY rank_usd DESC, g.started_at DESC, g.id DESC LIMIT {int(limit)}"
        )
        sql = f"SELECT {columns}, k.rank_usd FROM ({ranked}) k JOIN graph.sessions g ON g.id = k.id"
    else:
        sql = (
            f"SELECT {columns}, NULL::numeric AS rank_usd FROM {source}{q.sql()} "
            f"ORDER BY g.started_at DESC, g.id DESC LIMIT {int(limit)}"
        )
    outer = "p.rank_usd DESC, p.created_at DESC, p.id DESC" if by_cost else "p.created_at DESC, p.id DESC"
    if f.q:
        snippet = (
            f"ts_headline('english', translate(h.text, E'\\x02\\x03', ''), websearch_to_tsquery('english', {ts}), "
            f"{q.arg(HEADLINE_OPTIONS)})"
        )
        sql = (
            f"SELECT p.*, {snippet} AS snippet FROM ({sql}) p "
            f"LEFT JOIN LATERAL (SELECT {_graph_match('p.id', ts)} AS text) h ON true ORDER BY {outer}"
        )
    else:
        sql = f"SELECT p.*, NULL::text AS snippet FROM ({sql}) p ORDER BY {outer}"
    return sql, q.args


#: Billing's calls of each loop session of the page and its delegated sessions ($1 the ids, $2 the depth).
LOOP_TOTALS: Final = f"""
WITH RECURSIVE tree AS (
    SELECT s.id AS root, s.id, s.created_at, 0 AS level FROM sessions s WHERE s.id = ANY($1::uuid[])
    UNION ALL
    SELECT t.root, c.id, c.created_at, t.level + 1 FROM sessions c JOIN tree t ON c.parent_session_id = t.id
    WHERE t.level < $2
)
SELECT t.root AS id, count(m.event_id) AS calls, sum(m.cost_usd) AS usd,
       count(m.event_id) FILTER (WHERE m.cost_usd IS NULL) AS unpriced,
       coalesce(sum(m.input_tokens), 0) AS input_tokens, coalesce(sum(m.output_tokens), 0) AS output_tokens,
       coalesce(sum(m.cache_read_tokens), 0) AS cache_read_tokens,
       coalesce(sum(m.cache_write_5m_tokens + m.cache_write_1h_tokens), 0) AS cache_write_tokens,
       array_remove(array_agg(DISTINCT m.model), NULL) AS models, false AS billed_with_parent
FROM tree t LEFT JOIN model_calls m ON m.session_id = t.id AND m.created_at >= t.created_at - {CLOCK_SLACK}
GROUP BY t.root
"""
#: An imported top-level session's billed calls (its tree's); a subagent session's own invocations.
IMPORTED_TOTALS: Final = f"""
SELECT g.id, count(m.event_id) AS calls, sum(m.cost_usd) AS usd,
       count(m.event_id) FILTER (WHERE m.cost_usd IS NULL) AS unpriced,
       coalesce(sum(m.input_tokens), 0) AS input_tokens, coalesce(sum(m.output_tokens), 0) AS output_tokens,
       coalesce(sum(m.cache_read_tokens), 0) AS cache_read_tokens,
       coalesce(sum(m.cache_write_5m_tokens + m.cache_write_1h_tokens), 0) AS cache_write_tokens,
       array_remove(array_agg(DISTINCT m.model), NULL) AS models, false AS billed_with_parent
FROM graph.sessions g LEFT JOIN model_calls m ON m.session_id = g.id AND m.created_at >= g.started_at - {CLOCK_SLACK}
WHERE g.id = ANY($1::uuid[]) AND g.parent_session_id IS NULL
GROUP BY g.id
UNION ALL
SELECT g.id, count(i.id) FILTER (WHERE i.total_tokens > 0), NULL, 0,
       coalesce(sum(i.input_tokens), 0), coalesce(sum(i.output_tokens), 0), coalesce(sum(i.cache_read_tokens), 0),
       coalesce(sum(i.cache_write_tokens), 0), array_remove(array_agg(DISTINCT i.model), NULL), true
FROM graph.sessions g LEFT JOIN graph.model_invocations i ON i.session_id = g.id
WHERE g.id = ANY($1::uuid[]) AND g.parent_session_id IS NOT NULL
GROUP BY g.id
"""


def _row(r: Row, totals: Row | None) -> SessionRow:
    snippet = r["snippet"]
    kind = r["kind"]
    row = SessionRow(
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
        duration_s=r["duration_s"],
        cost_usd=Decimal(0),
    )
    if totals is not None:
        row.model_calls, row.unpriced_calls = int(totals["calls"]), int(totals["unpriced"])
        # No priced call: nothing spent when there was no call, an unknown cost when every call is unpriced.
        usd = totals["usd"]
        row.cost_usd = usd if usd is not None else (Decimal(0) if row.model_calls == 0 else None)
        row.input_tokens = int(totals["input_tokens"])
        row.output_tokens = int(totals["output_tokens"])
        row.cache_read_tokens = int(totals["cache_read_tokens"])
        row.cache_write_tokens = int(totals["cache_write_tokens"])
        row.models = sorted(totals["models"] or ())
        if totals["billed_with_parent"]:
            row.billed_with_parent, row.cost_usd = True, None
    return row


async def _totals(conn: Conn, rows: Sequence[Row]) -> dict[uuid.UUID, Row]:
    """Calls, cost, tokens and models of this page's sessions only."""
    loop = [r["id"] for r in rows if r["kind"] == "loop"]
    imported = [r["id"] for r in rows if r["kind"] == "imported"]
    out: dict[uuid.UUID, Row] = {}
    if loop:
        out |= {t["id"]: t for t in await conn.fetch(LOOP_TOTALS, loop, MAX_CHILD_DEPTH)}
    if imported:
        out |= {t["id"]: t for t in await conn.fetch(IMPORTED_TOTALS, imported)}
    return out


async def _hits(conn: Conn, sql: str, q: str) -> list[uuid.UUID] | None:
    """The sessions with a match of `q`, when there are fewer than FEW_HITS matches; else None."""
    probe = await conn.fetchrow(sql, q, FEW_HITS)
    if probe is not None and probe["n"] < FEW_HITS:
        return list(probe["ids"] or ())
    return None


LOOP_HITS: Final = (
    "SELECT count(*) AS n, array_agg(DISTINCT x.session_id) AS ids FROM (SELECT m.session_id "
    "FROM messages m WHERE m.search @@ websearch_to_tsquery('english', $1) LIMIT $2) x"
)
IMPORTED_HITS: Final = (
    "SELECT count(*) AS n, array_agg(DISTINCT x.session_id) AS ids FROM ("
    "(SELECT u.session_id FROM graph.user_inputs u WHERE u.search @@ websearch_to_tsquery('english', $1) LIMIT $2) "
    "UNION ALL "
    "(SELECT a.session_id FROM graph.assistant_messages a "
    "WHERE a.search @@ websearch_to_tsquery('english', $1) LIMIT $2)) x"
)


def _order_key(sort: Sort) -> Callable[[Row], tuple[Any, ...]]:
    if sort == "cost":
        return lambda r: (r["rank_usd"], r["created_at"], r["id"])
    return lambda r: (r["created_at"], r["id"])


async def list_sessions(
    conn: Conn, f: SessionFilters, cursor: str | None = None, limit: int = PAGE_SIZE
) -> SessionList:
    after = decode_cursor(cursor, f.sort) if cursor else None
    loop_wanted = f.kind != "imported" and not f.vendor
    # Imported sessions have no tags or loop sources.
    imported_wanted = f.kind != "loop" and not (f.tag or f.source)
    since = None
    if f.sort == "cost":
        since = f.since or datetime.now(UTC) - timedelta(days=COST_WINDOW_DAYS)
        # The rank's exact case (`_range_cost`) is a subquery a row that almost never runs, but the planner
        # costs it for every row of the range: it would compile the query (JIT, a second and more) to save
        # milliseconds.
        await conn.execute("SET LOCAL jit = off")
    if f.q:
        # Planned for this `q` each time: a generic plan of a prepared statement (asyncpg's, after five runs)
        # computes the tsquery again for every row it checks, and cannot tell a rare word from a common one.
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
    rows: list[Row] = []
    if loop_wanted:
        hits = await _hits(conn, LOOP_HITS, f.q) if f.q else None
        sql, args = _loop_query(f, after, limit + 1, hits, since)
        rows += await conn.fetch(sql, *args)
    if imported_wanted:
        hits = await _hits(conn, IMPORTED_HITS, f.q) if f.q else None
        sql, args = _imported_query(f, after, limit + 1, hits, since)
        rows += await conn.fetch(sql, *args)
    rows.sort(key=_order_key(f.sort), reverse=True)
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(last["created_at"], last["id"], last["rank_usd"] if f.sort == "cost" else None)
    totals = await _totals(conn, page)
    return SessionList(
        sessions=[_row(r, totals.get(r["id"])) for r in page], next_cursor=next_cursor, filters=f, ranked_since=since
    )


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
    q: Annotated[
        str | None,
        Query(
            max_length=500,
            description="full-text search over the messages, and imported sessions' inputs and assistant text",
        ),
    ] = None,
    sort: Annotated[
        Sort,
        Query(
            description="time: newest first; cost: the most expensive first, among the sessions started from "
            f"`since` on (without it, the last {COST_WINDOW_DAYS} days)"
        ),
    ] = "time",
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
        sort=sort,
    )


Filters = Annotated[SessionFilters, Depends(_filters)]
Cursor = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]
Limit = Annotated[int, Query(ge=1, le=200)]


@router.get("/api/sessions", response_model=SessionList)
async def api_sessions(
    who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> SessionList:
    """Sessions, newest first or the most expensive first (keyset pages), filtered, each with its cost (its
    delegated sessions' included), tokens, model calls, models and duration; with `q`, those with a message (an
    imported session: an input or the assistant's text) matching it."""
    async with db.reader(who.user) as conn:
        return await list_sessions(conn, filters, cursor, limit)


@router.get("/sessions", include_in_schema=False, response_class=HTMLResponse)
async def sessions_page(
    request: Request, who: SignedIn, db: Db, filters: Filters, cursor: Cursor = None, limit: Limit = PAGE_SIZE
) -> HTMLResponse:
    async with db.reader(who.user) as conn:
        page = await list_sessions(conn, filters, cursor, limit)
    query = list_query(filters)
    # snippet_html was escaped before its <mark> tags were added (highlight): it is markup of ours.
    snippets = {s.id: Markup(s.snippet_html) for s in page.sessions if s.snippet_html is not None}
    return render(
        request,
        "sessions.html",
        {
            "page": page,
            "f": filters,
            "query": query,
            "snippets": snippets,
            "wider": wider_ranges(query),
            "sort_queries": sort_queries(query),
            "cost_window_days": COST_WINDOW_DAYS,
        },
    )


def sort_queries(query: dict[str, str]) -> dict[str, dict[str, str]]:
    """The list's query sorted each way (the columns' links)."""
    by_time = {k: v for k, v in query.items() if k != "sort"}
    return {"time": by_time, "cost": dict(by_time, sort="cost")}


def list_query(filters: BaseModel) -> dict[str, str]:
    """A list's filters as its URL's query (a blank filter and the defaults left out)."""
    return {
        k: v
        for k, v in filters.model_dump(mode="json").items()
        if v not in (None, "", "all") and not (k == "sort" and v == "time")
    }


def wider_ranges(query: dict[str, str]) -> dict[str, dict[str, str]]:
    """Sorted by cost: the same list over the last 30 days and the last year (what `since` to give)."""
    now = datetime.now(UTC).replace(microsecond=0)
    return {
        label: dict(query, since=(now - timedelta(days=days)).isoformat())
        for label, days in (("the last 30 days", 30), ("the last year", 365))
    }


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


def parse_session_id(
    session_id: Annotated[str, Path(max_length=100, description="the session's id, a UUID")],
) -> uuid.UUID:
    """A session's id from the URL: anything but a UUID names no session, a 404 that says what an id looks like."""
    try:
        return uuid.UUID(session_id)
    except ValueError:
        raise HTTPException(
            404, f"no session “{session_id}”: a session id is a UUID, such as 0193a2f0-5c1e-7a41-9d3b-2f6c8e1b4a70"
        ) from None


#: A path's `{session_id}`, parsed by `parse_session_id`.
SessionId = Annotated[uuid.UUID, Depends(parse_session_id)]


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
async def api_session(who: SignedIn, db: Db, session_id: SessionId) -> SessionView:
    """One session: its turns, messages, tool calls, model calls and delegated child sessions."""
    return await _session_or_404(db, who, session_id)


@router.get("/sessions/{session_id}", include_in_schema=False, response_class=HTMLResponse)
async def session_page(request: Request, who: SignedIn, db: Db, session_id: SessionId) -> HTMLResponse:
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
async def session_live(request: Request, who: SignedIn, db: Db, session_id: SessionId) -> EventSourceResponse:
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
async def api_session_events(request: Request, who: SignedIn, db: Db, session_id: SessionId) -> EventSourceResponse:
    """Server-sent events: each of the session's events from now on, named by its type, as its JSON."""
    profile = await _visible_profile(db, who, session_id)
    live = _live(request)
    return EventSourceResponse(_stream(live, session_filter(profile, session_id)), ping=15)

"""A session's turn timeline (a waterfall of its model calls, tool calls, approval waits and delegated child turns on
one time axis per turn), and the session page's live updates, which merge into the turn they belong to.

* `session_timeline(view)`: each turn's spans from what `load_session` read (pure: no I/O).
  `/api/sessions/{id}/timeline` answers it as JSON; the session page draws it (templates/timeline.html).
* `LiveSession`: one browser's view of a session while it is watched. It folds the session's events (and its
  delegated children's turns and model calls, and the loop's approval requests) into what the page shows, and
  answers each with operations on the page (`Op`): put an element (a message, a tool call, a turn, a span)
  where it belongs, replacing the one with the same key, set a status, add to a count. A tool call is one
  element and one span whose state changes (requested, waiting for approval, approved, completed); the header's
  status and counts follow the events. static/session.js applies them and lays the bars out again.
* `stream(...)`: the server-sent events of /sessions/{id}/live: `ready`, then `update` (a JSON list of
  operations) per event, `reload` when events were dropped.

Times on the wire are milliseconds since the epoch (`data-start`, `data-end` of each span), so that the browser
lays out bars and the server only says when things happened. A bar's position is an SVG attribute (x, width in
thousandths of the turn's axis): the content security policy forbids style attributes, not SVG geometry.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel

from commonos.console.auth import SignedIn
from commonos.console.db import Database, get_db
from commonos.console.live import Live, Overflow
from commonos.console.metrics import LIVE_WATCHERS
from commonos.console.templating import ENV
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolResultMessage, UserMessage
from commonos.proto.requests import ApprovalRequest, approval_request_subject
from commonos.proto.subjects import EVENTS_PREFIX, session_filter
from commonos.runtime.postgres import Conn

if TYPE_CHECKING:
    from commonos.console.pages.sessions import SessionView, ToolCallView, TurnView

router = APIRouter(tags=["sessions"])

Db = Annotated[Database, Depends(get_db)]

#: The axis of a bar: thousandths of its turn's duration.
AXIS: Final = 1000
#: The narrowest bar drawn, in thousandths: an instant stays visible.
MIN_BAR: Final = 4
#: Deciders that decide without anyone waiting (the profile's policy, a hook: `hook:<name>`): no wait to draw.
NO_WAIT: Final = ("policy", "hook:")
#: How many event ids a live view remembers to drop the second copy of (its subscriptions overlap).
SEEN_EVENTS: Final = 10_000

SpanKind = Literal["model", "tool", "approval", "child"]


class Span(BaseModel):
    """One bar of a turn's timeline."""

    #: Unique in its turn: `model:<event id>`, `tool:<call id>`, `approval:<call id>`, `child:<turn id>`.
    key: str
    kind: SpanKind
    label: str
    started_at: datetime
    #: Null while it runs.
    finished_at: datetime | None
    #: completed, running, error, requested, waiting, approved, denied, timed_out, failed, …
    status: str
    #: Drawn under the span before it (an approval wait under its tool call).
    nested: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: Null when unpriced, or not priced yet (a live model call: billing prices it).
    cost_usd: Decimal | None = None
    cost_status: str | None = None
    # What expanding the span shows.
    provider: str | None = None
    model: str | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    latency_s: float | None = None
    args: dict[str, Any] | None = None
    result: str | None = None
    is_error: bool = False
    risk: str | None = None
    approval: str | None = None
    decided_by: str | None = None
    #: A child turn's session, its title and its model calls.
    session_id: uuid.UUID | None = None
    model_calls: int | None = None
    #: The bar, in thousandths of the turn's axis (the browser lays it out again as the turn runs).
    x: int = 0
    width: int = MIN_BAR

    @property
    def duration_ms(self) -> float | None:
        if self.finished_at is None:
            return None
        return max((self.finished_at - self.started_at).total_seconds() * 1000, 0.0)


class TurnTimeline(BaseModel):
    turn_id: uuid.UUID
    #: The turn's place in its session, from 1.
    number: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    spans: list[Span]
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: The priced model calls' cost (the turn's own; a child turn's span carries its session's).
    cost_usd: Decimal = Decimal(0)
    unpriced_calls: int = 0

    @property
    def axis_end(self) -> datetime:
        ends = [self.started_at, *(s.finished_at or s.started_at for s in self.spans)]
        if self.finished_at is not None:
            ends.append(self.finished_at)
        return max(ends)

    @property
    def duration_ms(self) -> float | None:
        if self.finished_at is None:
            return None
        return max((self.finished_at - self.started_at).total_seconds() * 1000, 0.0)


def lay_out(spans: list[Span], start: datetime, end: datetime) -> None:
    """Each span's bar on the axis start..end (a running span reaches the end)."""
    total = max((end - start).total_seconds(), 0.001)
    for s in spans:
        x = min(max((s.started_at - start).total_seconds() / total, 0.0), 1.0) * AXIS
        until = s.finished_at or end
        width = max((until - s.started_at).total_seconds() / total * AXIS, MIN_BAR)
        s.x = min(round(x), AXIS - MIN_BAR)
        s.width = max(min(round(width), AXIS - s.x), MIN_BAR)


def ordered(spans: list[Span]) -> list[Span]:
    """By start, a nested span right after its parent (an approval wait under its tool call)."""
    parents = sorted((s for s in spans if not s.nested), key=lambda s: (s.started_at, s.key))
    nested: dict[str, list[Span]] = {}
    for s in spans:
        if s.nested:
            nested.setdefault(s.key.split(":", 1)[1], []).append(s)
    out: list[Span] = []
    for s in parents:
        out.append(s)
        if s.kind == "tool":
            out += nested.pop(s.key.split(":", 1)[1], [])
    for rest in nested.values():
        out += rest
    return out


# The timeline of what was read.


def model_span(mc: Any) -> Span:
    """A model call of `ModelCallView`: it ended at its time, after its latency."""
    end: datetime = mc.created_at
    start = end - timedelta(seconds=mc.latency_s) if mc.latency_s else end
    return Span(
        key=f"model:{mc.id}",
        kind="model",
        label=f"{mc.provider}/{mc.model}",
        started_at=start,
        finished_at=end,
        status="unpriced" if mc.cost_status == "unpriced" else "completed",
        input_tokens=mc.input_tokens,
        output_tokens=mc.output_tokens,
        cost_usd=mc.cost_usd,
        cost_status=mc.cost_status,
        provider=mc.provider,
        model=mc.model,
        cache_read_tokens=mc.cache_read_tokens,
        cache_write_tokens=mc.cache_write_tokens,
        reasoning_tokens=mc.reasoning_tokens,
        latency_s=mc.latency_s,
    )


def tool_status(is_error: bool, approval: str | None) -> str:
    if approval is not None and approval != ev.ApprovalStatus.APPROVED:
        return approval
    return "error" if is_error else "completed"


def tool_spans(c: ToolCallView) -> list[Span]:
    spans = [
        Span(
            key=f"tool:{c.call_id}",
            kind="tool",
            label=c.name,
            started_at=c.started_at,
            finished_at=c.finished_at,
            status=tool_status(c.is_error, c.approval),
            args=c.args,
            result=c.result,
            is_error=c.is_error,
            risk=c.risk,
            approval=c.approval,
            decided_by=c.decided_by,
        )
    ]
    if c.approval is not None and c.decided_at is not None and not (c.decided_by or "").startswith(NO_WAIT):
        spans.append(approval_span(c.call_id, c.name, c.started_at, c.decided_at, c.approval, c.decided_by))
    return spans


def approval_span(
    call_id: str, name: str, start: datetime, decided_at: datetime | None, status: str, decided_by: str | None
) -> Span:
    return Span(
        key=f"approval:{call_id}",
        kind="approval",
        label=f"approval of {name}",
        started_at=min(start, decided_at) if decided_at is not None else start,
        finished_at=decided_at,
        status=status,
        nested=True,
        approval=None if status == "waiting" else status,
        decided_by=decided_by,
    )


def child_spans(turn: TurnView) -> list[Span]:
    spans: list[Span] = []
    for child in turn.children:
        for ct in child.turns:
            if ct.parent_turn_id != turn.id:
                continue
            spans.append(
                Span(
                    key=f"child:{ct.id}",
                    kind="child",
                    label=child.title or "delegated session",
                    started_at=ct.started_at,
                    finished_at=ct.finished_at,
                    status=ct.status,
                    input_tokens=child.totals.input_tokens,
                    output_tokens=child.totals.output_tokens,
                    cost_usd=child.totals.cost_usd if child.totals.model_calls else None,
                    session_id=child.id,
                    model_calls=child.totals.model_calls,
                )
            )
    return spans


def turn_timeline(turn: TurnView, number: int) -> TurnTimeline:
    spans = [model_span(mc) for mc in turn.model_calls]
    for c in turn.tool_calls:
        spans += tool_spans(c)
    spans += child_spans(turn)
    tl = TurnTimeline(
        turn_id=turn.id,
        number=number,
        status=turn.status,
        started_at=turn.started_at,
        finished_at=turn.finished_at,
        spans=ordered(spans),
        model_calls=len(turn.model_calls),
        tool_calls=len(turn.tool_calls),
        input_tokens=sum(mc.input_tokens for mc in turn.model_calls),
        output_tokens=sum(mc.output_tokens for mc in turn.model_calls),
        cost_usd=sum((mc.cost_usd for mc in turn.model_calls if mc.cost_usd is not None), Decimal(0)),
        unpriced_calls=sum(1 for mc in turn.model_calls if mc.cost_usd is None),
    )
    # A model call's start is its end less its latency: it may be before the turn's own start.
    lay_out(tl.spans, min([tl.started_at, *(sp.started_at for sp in tl.spans)]), tl.axis_end)
    return tl


def session_timeline(view: SessionView) -> list[TurnTimeline]:
    """The timeline of each of the session's own turns (a delegated child's turns are spans of its parent turn)."""
    return [turn_timeline(t, n) for n, t in enumerate(view.turns, 1)]


def epoch_ms(at: datetime | None) -> str:
    return "" if at is None else str(round(at.timestamp() * 1000))


def duration_text(ms: float | None) -> str:
    if ms is None:
        return "running"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    return f"{int(ms // 60_000)} min {ms % 60_000 / 1000:.0f} s"


ENV.globals["epoch_ms"] = epoch_ms
ENV.filters["duration"] = duration_text


@router.get(
    "/api/sessions/{session_id}/timeline",
    response_model=list[TurnTimeline],
    responses={404: {"description": "no such session"}},
)
async def api_session_timeline(who: SignedIn, db: Db, session_id: uuid.UUID) -> list[TurnTimeline]:
    """Each turn of the session as a timeline: its model calls, tool calls, approval waits and delegated child
    turns, each with its start, end, tokens and cost; positions in thousandths of the turn's duration."""
    from commonos.console.pages.sessions import _session_or_404

    return session_timeline(await _session_or_404(db, who, session_id))


# Live.


@dataclass
class Op:
    """One change to the page (static/session.js applies them in order).

    `put`: `html` replaces the element of `id`, or of `key` (a `data-key`) under the element `into` (an id), or
    is appended there; `mode` `create` leaves an existing one; with `unless`, nothing when an element of that
    key is there. `status`: the element of `id` shows `status`. `add`: the number in the element of `id` grows
    by `n`. `attr`: the element of `id` gets attribute `name` = `value`."""

    op: Literal["put", "status", "add", "attr"]
    into: str | None = None
    key: str | None = None
    id: str | None = None
    html: str | None = None
    mode: Literal["replace", "create"] = "replace"
    unless: str | None = None
    status: str | None = None
    n: int = 0
    name: str | None = None
    value: str | None = None

    def json(self) -> dict[str, Any]:
        own = {"n": "add", "mode": "put"}
        return {k: v for k, v in self.__dict__.items() if v is not None and own.get(k, self.op) == self.op}


@dataclass
class _Call:
    """What a live view knows of one tool call."""

    call_id: str
    name: str
    args: dict[str, Any]
    requested_at: datetime
    waiting_since: datetime | None = None
    decision: ev.ApprovalDecided | None = None
    record: ev.ToolCallRecorded | None = None


@dataclass
class _Turn:
    turn_id: uuid.UUID
    number: int
    started_at: datetime
    status: str = "running"
    finished_at: datetime | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    #: The latest time an event of the turn happened: a running turn's axis ends there.
    last_at: datetime | None = None


@dataclass
class _ChildTurn:
    turn_id: uuid.UUID
    session_id: uuid.UUID
    parent_turn_id: uuid.UUID
    started_at: datetime
    status: str = "running"
    finished_at: datetime | None = None
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class Known:
    """What the page showed when its stream started (read once): the session's turns in order, and its delegated
    descendants' sessions and turns."""

    turns: list[uuid.UUID] = field(default_factory=list)
    descendant_sessions: set[uuid.UUID] = field(default_factory=set)
    descendant_turns: set[uuid.UUID] = field(default_factory=set)


async def load_known(conn: Conn, session_id: uuid.UUID, max_depth: int = 8) -> Known:
    rows = await conn.fetch(
        """
        WITH RECURSIVE tree AS (
            SELECT id, 0 AS level FROM sessions WHERE id = $1
            UNION ALL
            SELECT c.id, t.level + 1 FROM sessions c JOIN tree t ON c.parent_session_id = t.id WHERE t.level < $2
        )
        SELECT tree.id AS session_id, tree.level, t.id AS turn_id
        FROM tree LEFT JOIN turns t ON t.session_id = tree.id
        ORDER BY tree.level, t.started_at, t.id
        """,
        session_id,
        max_depth,
    )
    known = Known()
    for r in rows:
        if r["level"] == 0:
            if r["turn_id"] is not None:
                known.turns.append(r["turn_id"])
        else:
            known.descendant_sessions.add(r["session_id"])
            if r["turn_id"] is not None:
                known.descendant_turns.add(r["turn_id"])
    return known


def subjects(profile_id: str, session_id: uuid.UUID) -> list[str]:
    """The session's events; the turns and model calls of its profile's sessions (its delegated children's are
    among them); its profile's approval requests."""
    return [
        session_filter(profile_id, session_id),
        f"{EVENTS_PREFIX}.{profile_id}.*.turn_started",
        f"{EVENTS_PREFIX}.{profile_id}.*.turn_finished",
        f"{EVENTS_PREFIX}.{profile_id}.*.model_call_completed",
        approval_request_subject(profile_id),
    ]


#: The event types two of `subjects` both deliver for the session itself.
_TWICE: Final = (ev.TurnStarted, ev.TurnFinished, ev.ModelCallCompleted)


class LiveSession:
    def __init__(self, session_id: uuid.UUID, known: Known) -> None:
        self.session_id = session_id
        self.numbers = {t: n for n, t in enumerate(known.turns, 1)}
        self.turns: dict[uuid.UUID, _Turn] = {}
        self.descendant_sessions = set(known.descendant_sessions)
        self.descendant_turns = set(known.descendant_turns)
        #: Delegated child turns of this session's turns, drawn as spans of the parent turn.
        self.children: dict[uuid.UUID, _ChildTurn] = {}
        self._seen: OrderedDict[uuid.UUID, None] = OrderedDict()
        # The templates' macros (Jinja template modules: their attributes are the macros).
        self._macros: Any = ENV.get_template("session_live.html").module
        self._timeline: Any = ENV.get_template("timeline.html").module

    def _first_time(self, event_id: uuid.UUID) -> bool:
        if event_id in self._seen:
            return False
        self._seen[event_id] = None
        if len(self._seen) > SEEN_EVENTS:
            self._seen.popitem(last=False)
        return True

    def apply(self, item: ev.Event | ApprovalRequest) -> list[Op]:
        """The page's changes for one event (none for another session's that is not a delegated child's)."""
        if isinstance(item, ApprovalRequest):
            return self._approval_request(item) if item.session_id == self.session_id else []
        if isinstance(item, _TWICE) and not self._first_time(item.event_id):
            return []
        if item.session_id != self.session_id:
            return self._descendant(item)
        match item:
            case ev.TurnStarted():
                return self._turn_started(item)
            case ev.TurnFinished():
                return self._turn_finished(item)
            case ev.MessageAppended():
                return self._message(item)
            case ev.ApprovalDecided():
                return self._approval(item)
            case ev.ToolCallRecorded():
                return self._tool_call(item)
            case ev.ModelCallCompleted():
                return self._model_call(item)
        return []

    # The session's own turns.

    def _turn(self, turn_id: uuid.UUID, at: datetime, ops: list[Op]) -> _Turn:
        """The turn, its article and its timeline put on the page when this view has not seen it yet."""
        turn = self.turns.get(turn_id)
        if turn is None:
            number = self.numbers.get(turn_id)
            if number is None:
                number = self.numbers[turn_id] = len(self.numbers) + 1
            turn = self.turns[turn_id] = _Turn(turn_id, number, at)
            mode: Literal["replace", "create"] = "create"
            ops.append(Op("put", into="conversation", id=f"turn-{turn_id}", mode=mode, html=self._article(turn)))
            ops.append(Op("put", into="timeline-turns", id=f"tl-{turn_id}", mode=mode, html=self._turn_timeline(turn)))
        if turn.last_at is None or at > turn.last_at:
            turn.last_at = at
            ops.append(Op("attr", id=f"tl-{turn_id}", name="data-last", value=epoch_ms(at)))
        return turn

    def _article(self, turn: _Turn) -> str:
        return str(self._macros.turn_article(turn.turn_id, turn.number, turn.started_at))

    def _turn_timeline(self, turn: _Turn) -> str:
        tl = TurnTimeline(
            turn_id=turn.turn_id,
            number=turn.number,
            status=turn.status,
            started_at=turn.started_at,
            finished_at=turn.finished_at,
            spans=[],
        )
        return str(self._timeline.turn_timeline(tl))

    def _status_ops(self, turn: _Turn) -> list[Op]:
        return [
            Op("status", id=f"turn-status-{turn.turn_id}", status=turn.status),
            Op("status", id=f"tl-status-{turn.turn_id}", status=turn.status),
            Op("status", id="session-status", status=turn.status),
            Op("attr", id=f"tl-{turn.turn_id}", name="data-end", value=epoch_ms(turn.finished_at)),
        ]

    def _turn_started(self, e: ev.TurnStarted) -> list[Op]:
        ops: list[Op] = []
        turn = self._turn(e.turn_id, e.occurred_at, ops)
        turn.started_at = min(turn.started_at, e.occurred_at)
        turn.status = "running"
        return [*ops, *self._status_ops(turn)]

    def _turn_finished(self, e: ev.TurnFinished) -> list[Op]:
        ops: list[Op] = []
        turn = self._turn(e.turn_id, e.occurred_at, ops)
        turn.status = e.status.value
        turn.finished_at = e.occurred_at
        return [*ops, *self._status_ops(turn)]

    def _message(self, e: ev.MessageAppended) -> list[Op]:
        from commonos.console.pages.sessions import MessageView, ToolCallRequest

        ops: list[Op] = []
        turn = self._turn(e.turn_id, e.occurred_at, ops)
        content = e.content
        into = f"turn-{e.turn_id}"
        if isinstance(content, ToolResultMessage):
            call = turn.calls.get(content.call_id)
            if call is not None and call.record is not None:
                return ops  # the tool call shows its result already
            view = MessageView(
                id=e.message_id,
                seq=e.seq,
                role="tool_result",
                text=content.content,
                call_id=content.call_id,
                is_error=content.is_error,
                active=True,
                created_at=e.occurred_at,
            )
            # A call shown before this view began (read from the database) holds the result too.
            unless = f"call:{content.call_id}"
            return [*ops, Op("put", into=into, key=f"msg:{e.seq}", html=self._message_html(view), unless=unless)]
        requests: list[ToolCallRequest] = []
        if isinstance(content, AssistantMessage):
            for c in content.tool_calls:
                requests.append(ToolCallRequest(id=c.id, name=c.name, args=dict(c.args)))
        text = content.text if isinstance(content, UserMessage | AssistantMessage) else None
        view = MessageView(
            id=e.message_id,
            seq=e.seq,
            role="user" if isinstance(content, UserMessage) else "assistant",
            text=text,
            tool_calls=requests,
            active=True,
            created_at=e.occurred_at,
        )
        ops.append(Op("put", into=into, key=f"msg:{e.seq}", html=self._message_html(view)))
        for r in requests:
            call = turn.calls.setdefault(r.id, _Call(r.id, r.name, r.args, e.occurred_at))
            ops.append(self._span_op(turn, self._tool_span(call)))
        return ops

    def _message_html(self, view: Any) -> str:
        return str(self._macros.live_message(view))

    def _call(self, turn: _Turn, call_id: str, name: str, args: dict[str, Any], at: datetime) -> _Call:
        return turn.calls.setdefault(call_id, _Call(call_id, name, args, at))

    def _approval_request(self, r: ApprovalRequest) -> list[Op]:
        ops: list[Op] = []
        now = datetime.now(UTC)
        turn = self._turn(r.turn_id, now, ops)
        call = self._call(turn, r.call_id, r.tool, dict(r.args), now)
        if call.decision is None and call.record is None:
            call.waiting_since = now
        return [*ops, *self._call_ops(turn, call)]

    def _approval(self, e: ev.ApprovalDecided) -> list[Op]:
        ops: list[Op] = []
        turn = self._turn(e.turn_id, e.occurred_at, ops)
        call = self._call(turn, e.call_id, e.call_id, {}, e.decided_at)
        call.decision = e
        return [*ops, *self._call_ops(turn, call)]

    def _tool_call(self, e: ev.ToolCallRecorded) -> list[Op]:
        ops: list[Op] = []
        turn = self._turn(e.turn_id, e.occurred_at, ops)
        call = self._call(turn, e.call_id, e.name, dict(e.args), e.started_at)
        call.name, call.args, call.record = e.name, dict(e.args), e
        return [*ops, *self._call_ops(turn, call)]

    def _call_ops(self, turn: _Turn, call: _Call) -> list[Op]:
        """The tool call's element in the conversation and its spans, as they are now."""
        from commonos.console.pages.sessions import ToolCallView

        into = f"turn-{turn.turn_id}"
        key = f"call:{call.call_id}"
        if call.record is not None:
            r = call.record
            decision = call.decision
            view = ToolCallView(
                id=r.tool_call_id,
                call_id=r.call_id,
                name=r.name,
                args=dict(r.args),
                result=r.result,
                is_error=r.is_error,
                risk=r.risk.value,
                approval=r.approval.value if r.approval is not None else None,
                decided_by=decision.decided_by if decision is not None else None,
                decided_at=decision.decided_at if decision is not None else None,
                started_at=r.started_at,
                finished_at=r.finished_at,
                duration_ms=round((r.finished_at - r.started_at).total_seconds() * 1000, 3),
            )
            html = str(self._macros.live_tool_call(view))
        else:
            html = str(self._macros.pending_call(call.call_id, call.name, call.args, self._call_state(call), call))
        ops = [Op("put", into=into, key=key, html=html), self._span_op(turn, self._tool_span(call))]
        wait = self._approval_span(call)
        if wait is not None:
            ops.append(self._span_op(turn, wait))
        return ops

    @staticmethod
    def _call_state(call: _Call) -> str:
        if call.decision is not None:
            return call.decision.status.value
        if call.waiting_since is not None:
            return "waiting"
        return "requested"

    def _tool_span(self, call: _Call) -> Span:
        r = call.record
        decision = call.decision
        if r is None:
            state = self._call_state(call)
            return Span(
                key=f"tool:{call.call_id}",
                kind="tool",
                label=call.name,
                started_at=call.requested_at,
                finished_at=None,
                status="running" if state == "approved" else state,
                args=call.args,
                approval=decision.status.value if decision is not None else None,
                decided_by=decision.decided_by if decision is not None else None,
            )
        return Span(
            key=f"tool:{call.call_id}",
            kind="tool",
            label=r.name,
            started_at=r.started_at,
            finished_at=r.finished_at,
            status=tool_status(r.is_error, r.approval.value if r.approval is not None else None),
            args=dict(r.args),
            result=r.result,
            is_error=r.is_error,
            risk=r.risk.value,
            approval=r.approval.value if r.approval is not None else None,
            decided_by=decision.decided_by if decision is not None else None,
        )

    def _approval_span(self, call: _Call) -> Span | None:
        decision = call.decision
        if decision is None and call.waiting_since is None:
            return None
        if decision is not None and decision.decided_by.startswith(NO_WAIT):
            return None
        start = call.record.started_at if call.record is not None else (call.waiting_since or call.requested_at)
        return approval_span(
            call.call_id,
            call.name,
            start,
            decision.decided_at if decision is not None else None,
            decision.status.value if decision is not None else "waiting",
            decision.decided_by if decision is not None else None,
        )

    def _span_op(self, turn: _Turn, span: Span) -> Op:
        end = turn.finished_at or max(turn.last_at or turn.started_at, span.finished_at or span.started_at)
        lay_out([span], turn.started_at, end)
        return Op("put", into=f"tl-{turn.turn_id}-spans", key=span.key, html=str(self._timeline.span_row(span)))

    def _model_call(self, e: ev.ModelCallCompleted) -> list[Op]:
        ops: list[Op] = []
        if e.turn_id is not None:
            turn = self._turn(e.turn_id, e.occurred_at, ops)
            start = e.occurred_at - timedelta(seconds=e.latency_s) if e.latency_s else e.occurred_at
            span = Span(
                key=f"model:{e.event_id}",
                kind="model",
                label=f"{e.provider}/{e.model}",
                started_at=start,
                finished_at=e.occurred_at,
                status="completed",
                input_tokens=e.input_tokens,
                output_tokens=e.output_tokens,
                cost_status="pricing",
                provider=e.provider,
                model=e.model,
                cache_read_tokens=e.cache_read_tokens,
                cache_write_tokens=e.cache_write_5m_tokens + e.cache_write_1h_tokens,
                reasoning_tokens=e.reasoning_tokens,
                latency_s=e.latency_s,
            )
            ops.append(self._span_op(turn, span))
        return [*ops, *self._totals(e)]

    @staticmethod
    def _totals(e: ev.ModelCallCompleted) -> list[Op]:
        return [
            Op("add", id="total-model-calls", n=1),
            Op("add", id="total-input-tokens", n=e.input_tokens),
            Op("add", id="total-output-tokens", n=e.output_tokens),
        ]

    # Delegated children.

    def _descendant(self, e: ev.Event) -> list[Op]:
        match e:
            case ev.TurnStarted(parent_turn_id=parent) if parent is not None and (
                parent in self.numbers or parent in self.descendant_turns
            ):
                self.descendant_sessions.add(e.session_id)
                self.descendant_turns.add(e.turn_id)
                if parent in self.numbers:
                    child = self.children[e.turn_id] = _ChildTurn(e.turn_id, e.session_id, parent, e.occurred_at)
                    return self._child_ops(child, e.occurred_at)
            case ev.TurnFinished() if e.turn_id in self.children:
                child = self.children[e.turn_id]
                child.status, child.finished_at = e.status.value, e.occurred_at
                return self._child_ops(child, e.occurred_at)
            case ev.ModelCallCompleted() if e.session_id in self.descendant_sessions:
                ops = self._totals(e)
                counted = self.children.get(e.turn_id) if e.turn_id is not None else None
                if counted is not None:
                    counted.model_calls += 1
                    counted.input_tokens += e.input_tokens
                    counted.output_tokens += e.output_tokens
                    ops += self._child_ops(counted, e.occurred_at)
                return ops
        return []

    def _child_ops(self, child: _ChildTurn, at: datetime) -> list[Op]:
        ops: list[Op] = []
        turn = self._turn(child.parent_turn_id, at, ops)
        span = Span(
            key=f"child:{child.turn_id}",
            kind="child",
            label="delegated session",
            started_at=child.started_at,
            finished_at=child.finished_at,
            status=child.status,
            input_tokens=child.input_tokens,
            output_tokens=child.output_tokens,
            session_id=child.session_id,
            model_calls=child.model_calls,
        )
        return [*ops, self._span_op(turn, span)]


async def stream(live: Live, subjects: Sequence[str], view: LiveSession) -> AsyncIterator[dict[str, str]]:
    """The session page's server-sent events: `ready`, `update` (a JSON list of `Op`s), `reload`."""
    LIVE_WATCHERS.inc()
    try:
        async with live.follow(*subjects) as items:
            yield {"event": "ready", "data": "following"}
            async for item in items:
                if isinstance(item, Overflow):
                    yield {"event": "reload", "data": f"{item.dropped} events were dropped: reload the page"}
                    continue
                ops = view.apply(item)
                if ops:
                    yield {"event": "update", "data": json.dumps([op.json() for op in ops], separators=(",", ":"))}
    finally:
        LIVE_WATCHERS.dec()


async def known_or_404(db: Database, who: SignedIn, session_id: uuid.UUID) -> tuple[str, Known]:
    """The session's profile and what the page showed of it; 404 for one the person cannot see."""
    sql = "SELECT profile_id FROM sessions WHERE id = $1"
    for primary in (False, True) if db.has_replica else (False,):
        async with db.reader(who.user, primary=primary) as conn:
            profile = await conn.fetchval(sql, session_id)
            if profile is not None:
                return str(profile), await load_known(conn, session_id)
    raise HTTPException(404, f"no session {session_id}")

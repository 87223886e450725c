"""Spans following the OpenTelemetry GenAI semantic conventions -> our events (pure: no I/O).

`map_spans` reads an OTLP ``ExportTraceServiceRequest`` and returns the events of its spans
(`commonos.otlp_gateway.common.Mapped`). A span's kind is its ``gen_ai.operation.name``:

=======================================  ===============================================================
span (``gen_ai.operation.name``)         events
=======================================  ===============================================================
``invoke_agent``                         a turn: ``turn_started`` at the span's start, ``turn_finished``
                                         at its end (status ``failed`` with the span's status message, or
                                         its ``error.type``, when the span's status is ERROR, else
                                         ``completed``). Nested in another ``invoke_agent`` of the
                                         request (any depth of other spans between): a child turn,
                                         ``parent_turn_id`` the nearest one's, ``depth`` one more.
``chat``, ``text_completion``,           ``model_call_completed`` (at the span's end) of the turn of the
``generate_content``, ``embeddings``     span (below). ``provider`` = ``gen_ai.provider.name`` (else the
                                         older ``gen_ai.system``), well-known names given the pricing's
                                         provider ids (``gcp.gemini`` -> ``google``, ``aws.bedrock`` ->
                                         ``aws``, ...); ``model`` = ``gen_ai.response.model`` else
                                         ``gen_ai.request.model``; ``request_id`` = ``gen_ai.response.id``;
                                         ``latency_s`` = the span's duration; ``stop_reason`` =
                                         ``gen_ai.response.finish_reasons`` (joined with ``,``). Tokens
                                         below. A span with ERROR status and no usage is a call that
                                         failed: ignored.
``execute_tool``                         ``tool_call_recorded``: ``call_id`` = ``gen_ai.tool.call.id``
                                         (else the span id), ``name`` = ``gen_ai.tool.name``, ``args`` and
                                         ``result`` from ``gen_ai.tool.call.arguments`` / ``.result``
                                         when the client records content (opt-in; args as
                                         `attributes.json_object` reads them, ``{}`` over 64 KiB; a
                                         result is cut to 16,000 characters, ``result_bytes`` then
                                         its whole size),
                                         ``is_error`` = ERROR status, ``started_at`` / ``finished_at``
                                         the span's.
anything else (``create_agent``, HTTP,   nothing (`Mapped.ignored`).
``retrieval``, ...)
=======================================  ===============================================================

Tokens. Our four input buckets are disjoint, the conventions' are not: ``gen_ai.usage.input_tokens``
includes the cache reads and writes. So ``input_tokens`` = ``gen_ai.usage.input_tokens`` -
``gen_ai.usage.cache_read.input_tokens`` - ``gen_ai.usage.cache_creation.input_tokens``;
``cache_read_tokens`` = the cache reads; ``cache_write_5m_tokens`` = the cache writes (the conventions do
not say which lifetime: the standard 5 minutes); ``output_tokens`` = ``gen_ai.usage.output_tokens``,
which includes ``reasoning_tokens`` = ``gen_ai.usage.reasoning.output_tokens``. (The deprecated
``gen_ai.usage.prompt_tokens`` / ``completion_tokens`` are read when the new names are absent.) A span
whose numbers do not add up — cache tokens above the input, reasoning above the output, a negative or
non-integer count, or one beyond 64 bits — is refused with the reason (OTLP partial success): billing
it would be a guess.

Sessions. A span's session is the first of, on the span and then on its ancestors present in the
request (nearest first): ``cos.session_id`` (a UUID: one of our sessions, used as is, no
``session_created``; the gateway cannot tell whose session it is: one of another profile has the
span's events dead-lettered, ``profile_mismatch``, by the journal-writer and billing),
``gen_ai.conversation.id`` (``mint_id("session", "otel", profile, conversation)``);
else one session per trace (``mint_id("session", "otel-trace", profile, trace_id)``). A session named by
a conversation or a trace gets a ``session_created`` (source ``otel``, the resource's tags, and, for the
session of a delegated agent whose parent agent is in another session, ``parent_session_id``), published
before anything of it. The profile is part of each id: two profiles' conversations never share a session
(the journal refuses another profile's events on a session), whatever their ids.

Turns, and spans split across requests. The turn of a ``chat`` / ``execute_tool`` span is found by
walking up its parents in the request. The walk stops at:

1. an ``invoke_agent`` span: that agent's turn (an agent refused for its times, none or ending before
   they start, is taken as missing: rule 2 starts its turn);
2. a parent that is not in the request (an SDK's batch processor exports a span when it ends, so the
   children of a long-running agent arrive before it): the turn ``mint_id("turn", "otel", profile,
   trace_id, <that parent's span id>)`` — exactly the id the parent's own turn has if it is the
   ``invoke_agent`` — and a placeholder ``turn_started`` (at the earliest start of its spans in the
   request, depth 0, the span's tags) whose event id is the one the agent's own ``turn_started`` has.
   Whichever comes first is the turn's row (the journal keeps the first of a turn id; JetStream drops
   the later copy of an event id inside its duplicate window); the agent's ``turn_finished`` then
   finishes it. A placeholder publishes no ``turn_finished``: the span it stands for does.
3. the trace's root, when no ``invoke_agent`` is above: an implicit turn of the root span (its id by
   the same rule, so the placeholder of rule 2 is the same turn when the root arrives later), started
   and finished with the root span.

Limits of what the spans say: a span whose walk stops at a missing span that is *not* its agent (a
non-agent root, or spans between its agent and it, split across requests) gets the turn of that missing
span, which stays running unless that span arrives as an agent, or as a root with GenAI spans below it in
its request (a request of other spans alone maps to nothing: a ``turn_finished`` of a turn that may not
exist would be dead-lettered); a delegated agent that arrives before its parent agent is
recorded as a top-level turn (nothing in a span says its missing parent is an agent); a span that names
no session itself, split from the ancestor that does, falls back to the trace's session. Instrumentations
that set ``gen_ai.conversation.id`` on every span avoid the last one. None of these changes a count: each
call and tool call is one event id whatever the split.

Our own loop (``commonos.loop.tracing``) already published its events: a span carrying ``cos.turn_id``
is ours, and maps to nothing (counted as ignored), so the loop's spans received by our gateway change
nothing. (Re-publishing them under the ids their ``cos.event_id`` names would be dropped as duplicates
only while the copy is the later one: a copy built from a span, without the turn's tags or the cache
write's TTL, must never be the one stored.)

Event ids. Every id is deterministic, so a retried request publishes the same events:
``mint_id("event", "otel", profile, <event type>, trace_id, span_id)`` for the events of a span (the
``turn_started`` of rule 2 being the one of the span it stands for), ``mint_id("event", "otel", profile,
"session_created", session_id)``; tool call ids ``mint_id("tool_call", "otel", profile, trace_id,
span_id)``. Ids are hex as OTLP/JSON writes them.

Tags: the resource's (`commonos.otlp_gateway.attributes.resource_tags`: ``cos.tag.<key>=<value>``, and the
bare keys of `Source.tag_attributes`); a resource whose attributes give an invalid tag has all its spans
refused with the reason.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NamedTuple

import msgspec
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from commonos.otlp_gateway.attributes import (
    attributes,
    from_nanos,
    integer,
    json_object,
)
from commonos.otlp_gateway.common import Mapped, Source
from commonos.proto import events as ev
from commonos.proto.errors import DataError
from commonos.proto.graph.ids import mint_uuid
from commonos.proto.tags import InvalidTag

__all__ = ["MODEL_OPERATIONS", "SOURCE", "map_spans", "provider_name"]

#: `session_created.source` of the sessions the GenAI spans create, and the vendor part of our ids.
SOURCE: Final = "otel"
INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL: Final = "execute_tool"
#: Operations that are one model call each.
MODEL_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content", "embeddings"})

#: Well-known `gen_ai.provider.name` values -> the provider ids pricing knows (genai-prices'); other names
#: are kept as sent (lower case): ``openai``, ``anthropic``, ``cohere``, ``deepseek``, ``groq``, ...
_PROVIDERS: Final = {
    "gcp.gemini": "google",
    "gcp.vertex_ai": "google",
    "gcp.gen_ai": "google",
    "aws.bedrock": "aws",
    "azure.ai.openai": "azure",
    "azure.ai.inference": "azure",
    "mistral_ai": "mistral",
    "x_ai": "x-ai",
    "moonshot_ai": "moonshotai",
}

#: A tool result longer than this is cut (like the loop's), `result_bytes` then giving its whole size.
MAX_RESULT_CHARS: Final = 16_000
#: A failed turn's error (the span's status message) is cut to this.
MAX_ERROR_CHARS: Final = 2_000

_json = msgspec.json.Encoder()
#: Our loop's ids a span may carry (`commonos.loop.tracing`): a span with one that is no UUID is refused.
_OUR_IDS: Final = ("cos.session_id", "cos.turn_id", "cos.event_id", "cos.tool_call_id")


class _Refused(DataError):
    """A span that cannot be mapped; the message says why (the partial-success error)."""


def provider_name(value: str) -> str:
    """A `gen_ai.provider.name` (or `gen_ai.system`) as our events name the provider."""
    name = value.strip().lower()
    return _PROVIDERS.get(name, name)


class _Span:
    """A span as the mapping reads it: its ids as hex, its attributes as Python values, its times once."""

    __slots__ = (
        "attrs",
        "end",
        "end_ns",
        "error",
        "key",
        "name",
        "op",
        "ours",
        "parent",
        "span",
        "start",
        "start_ns",
        "status_message",
        "tags",
        "trace",
    )

    def __init__(
        self,
        trace: str,
        span: str,
        parent: str | None,
        name: str,
        attrs: dict[str, Any],
        start_ns: int,
        end_ns: int,
        error: bool,
        status_message: str,
        tags: tuple[str, ...],
    ) -> None:
        self.trace = trace
        self.span = span
        self.parent = parent
        self.name = name
        self.attrs = attrs
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.error = error
        self.status_message = status_message
        self.tags = tags
        self.key = (trace, span)
        op = attrs.get("gen_ai.operation.name")
        self.op: str | None = op if isinstance(op, str) else None
        #: A span of our own loop: it published the events itself.
        self.ours = "cos.turn_id" in attrs
        self.start = from_nanos(start_ns)
        self.end = self.start if end_ns == start_ns else from_nanos(end_ns)

    def error_text(self) -> str:
        error_type = self.attrs.get("error.type")
        text = self.status_message or (str(error_type) if error_type is not None else "") or "error"
        return text[:MAX_ERROR_CHARS]


@dataclass
class _Session:
    id: uuid.UUID
    #: False for one of our sessions (`cos.session_id`): it exists, no `session_created`.
    create: bool
    #: The earliest start of its spans that have one (0: none yet); every span with an event has one.
    first_ns: int = 0
    tags: tuple[str, ...] = ()
    parent: uuid.UUID | None = None


@dataclass
class _Turn:
    id: uuid.UUID
    session: uuid.UUID
    parent: uuid.UUID | None
    depth: int


@dataclass
class _Out:
    """The events of one request, grouped so that each comes after what it needs."""

    sessions: dict[uuid.UUID, _Session] = field(default_factory=dict)
    starts: dict[uuid.UUID, ev.TurnStarted] = field(default_factory=dict)
    body: list[ev.EventBase] = field(default_factory=list)
    finishes: dict[uuid.UUID, ev.TurnFinished] = field(default_factory=dict)


def _uuid(kind: str, *parts: str) -> uuid.UUID:
    return mint_uuid(kind, *parts)


class _Mapper:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.profile = source.profile_id
        self.spans: dict[tuple[str, str], _Span] = {}
        self.order: list[_Span] = []
        self.out = _Out()
        self.mapped = Mapped()
        self._turns: dict[tuple[str, str], _Turn] = {}
        #: Turns this request publishes a `turn_started` for (their spans' or placeholders'), by turn id.
        self._placeholders: dict[uuid.UUID, tuple[_Span, _Session, int]] = {}
        #: Session ids by conversation id: the spans of a request mostly share a few.
        self._conversations: dict[str, uuid.UUID] = {}

    # --- reading -------------------------------------------------------------------------------------

    def read(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            spans = [s for scope in resource_spans.scope_spans for s in scope.spans]
            try:
                tags, left_out = self.source.tags_of(attributes(resource_spans.resource.attributes))
            except InvalidTag as exc:
                self.mapped.reject(str(exc), len(spans))
                continue
            if left_out is not None:
                self.mapped.warn(left_out)
            for span in spans:
                try:
                    parsed = _parse(span, tags)
                    for key in _OUR_IDS:
                        if key in parsed.attrs:
                            _parse_uuid(parsed.attrs[key], key)
                except _Refused as exc:
                    self.mapped.reject(str(exc))
                    continue
                if parsed.key in self.spans:  # the same span twice in one request: once
                    self.mapped.ignored += 1
                    continue
                self.spans[parsed.key] = parsed
                self.order.append(parsed)

    # --- ids -----------------------------------------------------------------------------------------

    def event_id(self, kind: str, span: _Span) -> uuid.UUID:
        return _uuid("event", SOURCE, self.profile, kind, span.trace, span.span)

    def turn_id(self, trace: str, span_id: str) -> uuid.UUID:
        return _uuid("turn", SOURCE, self.profile, trace, span_id)

    # --- structure -----------------------------------------------------------------------------------

    def parent_of(self, span: _Span) -> _Span | None:
        return self.spans.get((span.trace, span.parent)) if span.parent else None

    def session_of(self, span: _Span) -> _Session:
        """The session a span names, or the nearest ancestor in the request names, else its trace's."""
        current: _Span | None = span
        seen: set[tuple[str, str]] = set()
        while current is not None and current.key not in seen:
            seen.add(current.key)
            ours = current.attrs.get("cos.session_id")
            if ours is not None:
                return self._session(_parse_uuid(ours, "cos.session_id"), False, span)
            conversation = current.attrs.get("gen_ai.conversation.id")
            if isinstance(conversation, str | int) and not isinstance(conversation, bool) and str(conversation):
                return self._session(self._conversation_session(str(conversation)), True, span)
            current = self.parent_of(current)
        return self._session(_uuid("session", "otel-trace", self.profile, span.trace), True, span)

    def _conversation_session(self, conversation: str) -> uuid.UUID:
        session_id = self._conversations.get(conversation)
        if session_id is None:
            session_id = self._conversations[conversation] = _uuid("session", SOURCE, self.profile, conversation)
        return session_id

    def _session(self, session_id: uuid.UUID, create: bool, span: _Span) -> _Session:
        session = self.out.sessions.get(session_id)
        if session is None:
            session = self.out.sessions[session_id] = _Session(session_id, create, 0, span.tags)
        # Only a span with a time dates the session (an agent without one is refused, its calls are not).
        if span.start is not None and (session.first_ns == 0 or span.start_ns < session.first_ns):
            session.first_ns = span.start_ns
        return session

    def walk(self, span: _Span) -> tuple[str, _Span | str]:
        """Where the walk up from `span`'s parent stops: ("agent", the span), ("missing", its span id) or
        ("root", the root span; `span` itself when it has no parent)."""
        current = span
        seen = {span.key}
        while current.parent:
            parent = self.spans.get((current.trace, current.parent))
            if parent is None or parent.key in seen:  # a loop of parents: as good as missing
                return ("missing", current.parent)
            if parent.op == INVOKE_AGENT:
                return ("agent", parent)
            seen.add(parent.key)
            current = parent
        return ("root", current)

    def agent_turn(self, agent: _Span) -> _Turn:
        """The turn of an `invoke_agent` span (ours: the loop's ids; else ours to publish)."""
        known = self._turns.get(agent.key)
        if known is not None:
            return known
        session = self.session_of(agent)
        if agent.ours:
            depth = integer(agent.attrs.get("cos.turn.depth"))
            turn = _Turn(_parse_uuid(agent.attrs["cos.turn_id"], "cos.turn_id"), session.id, None, max(depth or 0, 0))
            self._turns[agent.key] = turn
            return turn
        parent: _Turn | None = None
        where, found = self.walk(agent)
        if where == "agent":
            assert isinstance(found, _Span)
            # Provisional, so that a loop of parents (malformed spans) ends here.
            self._turns[agent.key] = _Turn(self.turn_id(agent.trace, agent.span), session.id, None, 0)
            parent = self.agent_turn(found)
        turn = _Turn(
            self.turn_id(agent.trace, agent.span),
            session.id,
            parent.id if parent is not None else None,
            parent.depth + 1 if parent is not None else 0,
        )
        self._turns[agent.key] = turn
        if parent is not None and parent.session != session.id and session.create and session.parent is None:
            session.parent = parent.session
        return turn

    def turn_of(self, span: _Span, session: _Session) -> uuid.UUID:
        """The turn of a model call or tool call span, publishing the placeholder or implicit turn it needs."""
        where, found = self.walk(span)
        if where == "agent":
            assert isinstance(found, _Span)
            if not found.ours and not _timed(found):  # an agent refused for its times: as if it were missing
                return self.placeholder(span, found.span, session)
            return self.agent_turn(found).id
        if where == "missing":
            assert isinstance(found, str)
            return self.placeholder(span, found, session)
        assert isinstance(found, _Span)
        root = found
        turn_id = self.turn_id(root.trace, root.span)
        if turn_id in self.out.starts:
            return turn_id
        if not _timed(root):  # a root without a time: a placeholder, as if it were missing
            return self.placeholder(span, root.span, session)
        self.out.starts[turn_id] = self._turn_started(root, turn_id, session, None, 0)
        self.out.finishes[turn_id] = self._turn_finished(root, turn_id, session)
        return turn_id

    def placeholder(self, span: _Span, stands_for: str, session: _Session) -> uuid.UUID:
        """The turn of span `stands_for` of `span`'s trace, started (placeholder) at its earliest start here."""
        turn_id = self.turn_id(span.trace, stands_for)
        known = self._placeholders.get(turn_id)
        if known is None or span.start_ns < known[2]:
            stand_in = _Span(span.trace, stands_for, None, "", {}, span.start_ns, span.start_ns, False, "", span.tags)
            self._placeholders[turn_id] = (stand_in, session, span.start_ns)
        return turn_id

    # --- events --------------------------------------------------------------------------------------

    def _turn_started(
        self, span: _Span, turn_id: uuid.UUID, session: _Session, parent: uuid.UUID | None, depth: int
    ) -> ev.TurnStarted:
        return ev.TurnStarted(
            event_id=self.event_id("turn_started", span),
            occurred_at=_at(span.start),
            profile_id=self.profile,
            session_id=session.id,
            turn_id=turn_id,
            parent_turn_id=parent,
            depth=depth,
            tags=span.tags,
        )

    def _turn_finished(self, span: _Span, turn_id: uuid.UUID, session: _Session) -> ev.TurnFinished:
        return ev.TurnFinished(
            event_id=self.event_id("turn_finished", span),
            occurred_at=_at(span.end),
            profile_id=self.profile,
            session_id=session.id,
            turn_id=turn_id,
            status=ev.TurnStatus.FAILED if span.error else ev.TurnStatus.COMPLETED,
            error=span.error_text() if span.error else None,
        )

    def map_agent(self, span: _Span) -> None:
        if span.ours:
            self.mapped.ignored += 1  # the loop published the turn
            return
        _times(span)
        turn = self.agent_turn(span)
        session = self.session_of(span)
        self.out.starts[turn.id] = self._turn_started(span, turn.id, session, turn.parent, turn.depth)
        self.out.finishes[turn.id] = self._turn_finished(span, turn.id, session)

    def _place(self, span: _Span) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID] | None:
        """(event id, session id, turn id) of a call's event; None when it maps to nothing."""
        if span.ours:
            return None  # the loop published it
        session = self.session_of(span)
        turn = self.turn_of(span, session)
        return (self.event_id(_event_kind(span), span), session.id, turn)

    def map_model_call(self, span: _Span) -> None:
        latency = _times(span)
        usage = _usage(span.attrs)
        if usage is None and span.error:
            self.mapped.ignored += 1  # a call that failed: nothing was used
            return
        provider = _first_text(span.attrs, "gen_ai.provider.name", "gen_ai.system")
        if provider is None:
            raise _Refused(f"{_where(span)}: no gen_ai.provider.name (nor gen_ai.system)")
        model = _first_text(span.attrs, "gen_ai.response.model", "gen_ai.request.model")
        if model is None:
            raise _Refused(f"{_where(span)}: no gen_ai.response.model nor gen_ai.request.model")
        if max(len(provider), len(model)) > ev.MAX_NAME_CHARS:
            raise _Refused(f"{_where(span)}: a provider or model name longer than {ev.MAX_NAME_CHARS} characters")
        tokens = _buckets(span, usage or {})
        place = self._place(span)
        if place is None:
            self.mapped.ignored += 1
            return
        event_id, session, turn = place
        reasons = span.attrs.get("gen_ai.response.finish_reasons")
        if isinstance(reasons, list):
            stop = ",".join(str(r) for r in reasons if r is not None and str(r)) or None
        else:
            stop = str(reasons) if reasons else None
        response_id = span.attrs.get("gen_ai.response.id")
        self.out.body.append(
            ev.ModelCallCompleted(
                event_id=event_id,
                occurred_at=_at(span.end),
                profile_id=self.profile,
                session_id=session,
                turn_id=turn,
                provider=provider_name(provider),
                model=model,
                request_id=str(response_id) if response_id else None,
                latency_s=latency,
                stop_reason=stop,
                tags=span.tags,
                input_tokens=tokens.input,
                output_tokens=tokens.output,
                cache_read_tokens=tokens.cache_read,
                cache_write_5m_tokens=tokens.cache_write,
                reasoning_tokens=tokens.reasoning,
            )
        )

    def map_tool_call(self, span: _Span) -> None:
        _times(span)
        name = _first_text(span.attrs, "gen_ai.tool.name") or span.name.removeprefix(EXECUTE_TOOL).strip()
        if not name:
            raise _Refused(f"{_where(span)}: an execute_tool span without gen_ai.tool.name")
        place = self._place(span)
        if place is None:
            self.mapped.ignored += 1
            return
        event_id, session, turn = place
        tool_call_id = _uuid("tool_call", SOURCE, self.profile, span.trace, span.span)
        result, result_bytes = _result(span.attrs.get("gen_ai.tool.call.result"))
        self.out.body.append(
            ev.ToolCallRecorded(
                event_id=event_id,
                occurred_at=_at(span.end),
                profile_id=self.profile,
                session_id=session,
                turn_id=turn,
                tool_call_id=tool_call_id,
                call_id=_first_text(span.attrs, "gen_ai.tool.call.id") or span.span,
                name=name,
                args=json_object(span.attrs.get("gen_ai.tool.call.arguments"), "arguments"),
                result=result,
                result_bytes=result_bytes,
                is_error=span.error,
                started_at=_at(span.start),
                finished_at=_at(span.end),
            )
        )

    def map_all(self) -> Mapped:
        handlers = {INVOKE_AGENT: self.map_agent, EXECUTE_TOOL: self.map_tool_call}
        handlers |= dict.fromkeys(MODEL_OPERATIONS, self.map_model_call)
        for span in self.order:
            handler = handlers.get(span.op or "")
            if handler is None:
                self.mapped.ignored += 1
                continue
            try:
                handler(span)
            except _Refused as exc:  # raised before the span changed anything
                self.mapped.reject(str(exc))
        return self.finish()

    def finish(self) -> Mapped:
        out = self.out
        for turn_id, (stand_in, session, _start) in self._placeholders.items():
            if turn_id not in out.starts:
                out.starts[turn_id] = self._turn_started(stand_in, turn_id, session, None, 0)
        events: list[ev.EventBase] = []
        used = {e.session_id for e in (*out.starts.values(), *out.body, *out.finishes.values())}
        for session in out.sessions.values():
            if session.create and session.id in used:
                events.append(
                    ev.SessionCreated(
                        event_id=_uuid("event", SOURCE, self.profile, "session_created", str(session.id)),
                        occurred_at=_at(from_nanos(session.first_ns)),
                        profile_id=self.profile,
                        session_id=session.id,
                        source=SOURCE,
                        tags=session.tags,
                        parent_session_id=session.parent if session.parent != session.id else None,
                    )
                )
        events += out.starts.values()
        events += out.body
        events += out.finishes.values()
        seen: set[uuid.UUID] = set()
        for event in events:
            if event.event_id not in seen:
                seen.add(event.event_id)
                self.mapped.events.append(event)
        return self.mapped


def map_spans(request: ExportTraceServiceRequest, source: Source) -> Mapped:
    """The events of a request's GenAI spans (see the module's table), the spans refused and ignored."""
    mapper = _Mapper(source)
    mapper.read(request)
    return mapper.map_all()


# --- reading a span -----------------------------------------------------------------------------------


def _parse(span: Span, tags: tuple[str, ...]) -> _Span:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise _Refused(f"span {span.name!r}: its trace id is not 16 bytes, or is all zeros")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise _Refused(f"span {span.name!r}: its span id is not 8 bytes, or is all zeros")
    if span.parent_span_id and len(span.parent_span_id) != 8:
        raise _Refused(f"span {span.name!r}: its parent span id is not 8 bytes")
    parent = span.parent_span_id.hex() if any(span.parent_span_id) else None
    return _Span(
        trace=span.trace_id.hex(),
        span=span.span_id.hex(),
        parent=parent,
        name=span.name,
        attrs=attributes(span.attributes),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        error=span.status.code == Status.STATUS_CODE_ERROR,
        status_message=span.status.message,
        tags=tags,
    )


def _where(span: _Span) -> str:
    return f"span {span.span} of trace {span.trace} ({span.name!r})"


def _timed(span: _Span) -> bool:
    """Whether the span has a start and an end, not before its start."""
    return span.start is not None and span.end is not None and span.end_ns >= span.start_ns


def _times(span: _Span) -> float:
    """The span's duration in seconds; refuses a span without a start or that ends before it starts."""
    if not _timed(span):
        raise _Refused(f"{_where(span)}: no start or end time, or it ends before it starts")
    return (span.end_ns - span.start_ns) / 1e9


def _at(moment: datetime | None) -> datetime:
    assert moment is not None  # checked by `_times` first
    return moment


def _parse_uuid(value: Any, key: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise _Refused(f"{key} {str(value)[:64]!r} is not a UUID") from None


def _first_text(attrs: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _event_kind(span: _Span) -> str:
    return "tool_call_recorded" if span.op == EXECUTE_TOOL else "model_call_completed"


#: The usage attributes, and the deprecated names read when the new ones are absent.
_USAGE: Final = {
    "input": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
    "output": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
    "cache_read": ("gen_ai.usage.cache_read.input_tokens",),
    "cache_creation": ("gen_ai.usage.cache_creation.input_tokens",),
    "reasoning": ("gen_ai.usage.reasoning.output_tokens",),
}


def _usage(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The span's usage attributes as sent (None when it has none)."""
    found: dict[str, Any] = {}
    for bucket, keys in _USAGE.items():
        for key in keys:
            if key in attrs:
                found[bucket] = (key, attrs[key])
                break
    return found or None


class _Tokens(NamedTuple):
    """A call's tokens in our disjoint buckets."""

    input: int
    output: int
    cache_read: int
    cache_write: int
    reasoning: int


def _buckets(span: _Span, usage: dict[str, Any]) -> _Tokens:
    """Our disjoint buckets from the conventions' counts; refuses counts that do not add up."""
    counts: dict[str, int] = {}
    for bucket in _USAGE:
        if bucket not in usage:
            counts[bucket] = 0
            continue
        key, value = usage[bucket]
        number = integer(value)
        if number is None or not 0 <= number <= ev.MAX_COUNT:
            raise _Refused(f"{_where(span)}: {key} is {str(value)[:32]!r}, not a count")
        counts[bucket] = number
    cached = counts["cache_read"] + counts["cache_creation"]
    if cached > counts["input"]:
        raise _Refused(
            f"{_where(span)}: the cache tokens (read {counts['cache_read']} + written {counts['cache_creation']}) "
            f"exceed gen_ai.usage.input_tokens ({counts['input']}), which includes them"
        )
    if counts["reasoning"] > counts["output"]:
        raise _Refused(
            f"{_where(span)}: gen_ai.usage.reasoning.output_tokens ({counts['reasoning']}) exceeds "
            f"gen_ai.usage.output_tokens ({counts['output']}), which includes them"
        )
    return _Tokens(
        input=counts["input"] - cached,
        output=counts["output"],
        cache_read=counts["cache_read"],
        cache_write=counts["cache_creation"],
        reasoning=counts["reasoning"],
    )


def _result(value: Any) -> tuple[str | None, int | None]:
    """`gen_ai.tool.call.result` as text, cut to `MAX_RESULT_CHARS` (then with its whole size in bytes)."""
    if value is None:
        return None, None
    if not isinstance(value, str):
        try:
            value = _json.encode(value).decode()
        except (TypeError, msgspec.EncodeError):
            value = str(value)
    if len(value) <= MAX_RESULT_CHARS:
        return value, None
    return value[:MAX_RESULT_CHARS], len(value.encode("utf-8", "surrogatepass"))

"""Claude Code's OpenTelemetry log events -> our events (pure: no I/O).

Claude Code (``CLAUDE_CODE_ENABLE_TELEMETRY=1``, ``OTEL_LOGS_EXPORTER=otlp``) logs one record per event,
scope ``com.anthropic.claude_code.events``, resource ``service.name=claude-code``; the event's name is
its ``event.name`` attribute (``api_request``; the body says ``claude_code.api_request``, and a name
written ``claude_code.api_request`` is read alike). Every record carries ``session.id``; those of a
prompt's work carry its ``prompt.id``. Checked against Claude Code 2.1.332's recorded payloads
(tests/fixtures/clients/claude-code-2.1.332).

=====================================  ===================================================================
Claude Code record / attribute         our event / field
=====================================  ===================================================================
``session.id``                         session ``mint_id("session", scope, session.id)`` (the
                                       importer's root session of the same transcript);
                                       ``session_created`` (source ``claude-code``, tags = the
                                       resource's tags + ``vendor:claude-code``) once per request
``prompt.id``                          turn ``vendor_turn_id(scope, session.id, prompt.id)`` (the
                                       importer's turn of the same prompt's calls); ``turn_started``
                                       once per request, at the ``user_prompt``'s time (else the first
                                       record of the prompt in the request); ended by the sweeper
``user_prompt``                        ``turn_started`` (the prompt's text is not stored)
``api_request``                        ``model_call_completed``, id
                                       ``request_call_event_id(scope, request_id)``
  ``request_id``                         ``request_id`` (and the event id, as the importer's)
  ``model``                              ``model``; provider ``anthropic``
  ``input_tokens``                       ``input_tokens`` (already without cache reads and writes)
  ``output_tokens``                      ``output_tokens``
  ``cache_read_tokens``                  ``cache_read_tokens``
  ``cache_creation_5m_tokens``           ``cache_write_5m_tokens`` (when absent: ``cache_creation_tokens``
                                         less the 1h ones)
  ``cache_creation_1h_tokens``           ``cache_write_1h_tokens``
  ``cost_usd``                           ``reported_cost_usd`` (Decimal of the number as sent; none when
                                         it is negative or above 1e12, which billing does not store)
  ``duration_ms``                        ``latency_s`` (/ 1000)
  ``speed``                              ``speed`` (``normal`` -> ``standard``, ``fast`` -> ``fast``)
  ``prompt.id``                          ``turn_id``
  record time                            ``occurred_at``
``tool_result``                        ``tool_call_recorded`` (``call_id`` = ``tool_use_id``, ``name`` =
                                       ``tool_name``, ``is_error`` = not ``success``, ``result`` = its
                                       ``error`` when it failed, ``args`` = ``tool_parameters`` when it is
                                       a JSON object of at most 64 KiB (sent only with
                                       ``OTEL_LOG_TOOL_DETAILS=1``; `attributes.json_object`),
                                       ``finished_at`` = the record's time, ``started_at`` = that less
                                       ``duration_ms`` (that time itself when the duration is missing,
                                       not above 0, or reaches before the year 1); ``approval`` left
                                       empty, see below)
``tool_decision``                      ``approval_decided`` (``tool_call_id`` = ours of ``tool_use_id``,
                                       ``status`` ``approved`` for ``decision=accept``, else ``denied``;
                                       ``decided_by`` ``policy`` for ``source=config``, ``hook`` for
                                       ``hook``, ``user`` for ``user_*``, else the source as sent)
any other (``assistant_response``,     ignored (counted), never an error
``compaction``, ``plugin_loaded``, …)
=====================================  ===================================================================

Decisions:

* **Turns end when the telemetry shows they are over.** Claude Code logs the start of a prompt's work
  (``user_prompt``) but nothing at its end (no record says the agent is done, and
  ``assistant_response`` comes after every response with text, tool calls or not). So the gateway
  ends a turn when the session's next prompt is known, or when no record of it has arrived for
  ``COS_OTLP_TURN_IDLE_S``, at its last record's time (a record of no event, ``assistant_response`` say,
  counts when its request has a record mapped to the turn), with the status ``interrupted``: whether
  it completed is not known (:mod:`~commonos.otlp_gateway.turns` says why, the sweeper does it).
* **Turns and imports agree.** A transcript's lines name their prompt too (``promptId``): the importer
  puts each call of a prompt in ``vendor_turn_id(scope, sessionId, promptId)``, this module's turn of
  that prompt, so a call has the same turn whichever source is stored first. The import writes the
  session graph (``graph.user_inputs``, one a prompt), never the ``turns`` table: the turns of a session
  received here are the gateway's alone, one a prompt, and importing its transcript adds none.
* **Approvals are events of their own.** Every tool use has a ``tool_decision`` (``source=config``
  when the permission settings decided), and it may arrive in another request than the
  ``tool_result``; so it is an ``approval_decided`` (the approvals table keeps one per tool call, and
  needs no tool call row), and the tool call's own ``approval`` column stays empty rather than
  depending on how the client batched its records.
* **Model call ids, and which source wins.** A call's event id is
  ``request_call_event_id(scope, request_id)``, which the importer mints for the same call from
  its transcript's ``requestId`` imported into the token's profile: a session received here and later
  imported (or the other way round) is billed once, whichever comes first. (*scope*, here and in the
  table, is ``vendor_scope("claude-code", profile)``: ``claude-code`` for the profile ``claude-code``,
  ``claude-code@<profile>`` for any other; see :mod:`~commonos.otlp_gateway.common`.)
  The first event stored wins (JetStream drops the second within
  its duplicate window, billing's ``ON CONFLICT (event_id)`` after it; both carry the request id, and
  billing also keeps one call per profile, provider and request id whatever its event id). Both carry the same
  tokens (tested on the recorded sessions); only the other fields differ: the OTLP event has the turn,
  the reported cost and the latency, the imported one the stop reason. Calls only one source has: the
  ``/compact`` summary call is an ``api_request`` but no transcript line (only the gateway bills it);
  a reply cut off mid-stream is neither. A record without ``request_id`` (no Claude Code release we
  know) gets a gateway id of its session, prompt, ``event.sequence`` and time, which the importer
  cannot match: such a call arriving both ways would be counted twice.
* **Each profile its own ids.** The profile is part of the session's and every call's id, so two
  profiles sending the same ``session.id`` and request ids have two sessions and their own calls;
  neither can make the other's calls duplicates or dead letters. To receive a session here and import
  it too, give the gateway's token the profile the import uses (``claude-code`` by default, or
  ``cos import claude --profile``): the ids then agree.
* A subagent's calls carry their parent's ``session.id`` (and an ``agent_id``): they are the parent
  session's, as the importer bills them on its root session too.
* A mapped record without ``session.id`` or without a time is refused (partial success), with why;
  so is an ``api_request`` whose call billing could not store (a model name longer than 256
  characters, a count beyond 64 bits): billing would dead-letter it. A time no UTC datetime holds
  (``event.timestamp`` in the year 1 east of UTC, say) is no time (`attributes.timestamp`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from commonos.otlp_gateway.attributes import (
    before,
    boolean,
    count,
    decimal,
    integer,
    json_object,
    number,
    text,
)
from commonos.otlp_gateway.common import CallAt, Emitter, Record, gateway_id
from commonos.proto.events import MAX_COUNT, MAX_NAME_CHARS, ApprovalDecided, ModelCallCompleted, ToolCallRecorded
from commonos.proto.graph.ids import request_call_event_id
from commonos.proto.vendors import CLAUDE_CODE

#: The pricing provider of Claude Code's models.
PROVIDER: Final = "anthropic"
#: Claude Code's ``speed`` values as ours (`commonos.proto.graph` speeds).
SPEEDS: Final = {"normal": "standard", "standard": "standard", "fast": "fast", "ultrafast": "ultrafast"}
#: A tool call's turn when its record names no prompt.
NO_PROMPT: Final = "no-prompt"
MAPPED: Final = frozenset({"user_prompt", "api_request", "tool_result", "tool_decision"})
#: The largest reported cost billing stores, in dollars.
MAX_REPORTED_COST: Final = Decimal("1e12")
_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "cache_creation_5m_tokens",
    "cache_creation_1h_tokens",
)


def event_name(record: Record) -> str:
    """The record's event name without Claude Code's ``claude_code.`` prefix."""
    return record.name.removeprefix("claude_code.")


def decided_by(source: str | None) -> str:
    if source == "config":
        return "policy"
    if source == "hook":
        return "hook"
    if source is not None and source.startswith("user"):
        return "user"
    return source or "unknown"


def unstorable(attrs: dict[str, Any]) -> str | None:
    """Why billing could not store an ``api_request``'s call (None when it can)."""
    model = text(attrs.get("model"))
    if model is not None and len(model) > MAX_NAME_CHARS:
        return f"claude_code.api_request with a model name longer than {MAX_NAME_CHARS} characters"
    for key in _COUNTS:
        number = integer(attrs.get(key))
        if number is not None and number > MAX_COUNT:
            return f"claude_code.api_request with {key} {number}, beyond 64 bits"
    return None


def _cost(value: Any) -> Decimal | None:
    cost = decimal(value)
    return cost if cost is not None and 0 <= cost <= MAX_REPORTED_COST else None


def map_records(records: list[Record], tags: tuple[str, ...], emitter: Emitter) -> None:
    """Add the events of one resource's Claude Code records (in their order) to `emitter`."""
    mapped = emitter.mapped
    others: list[tuple[str, str, datetime]] = []  # records of no event naming a prompt: (session, prompt, time)
    for record in records:
        name = event_name(record)
        if name not in MAPPED:
            mapped.ignored += 1
            session_key, prompt = text(record.attributes.get("session.id")), text(record.attributes.get("prompt.id"))
            if session_key is not None and prompt is not None and record.time is not None:
                others.append((session_key, prompt, record.time))
            continue
        session_key = text(record.attributes.get("session.id"))
        if session_key is None:
            mapped.reject(f"claude_code.{name} without session.id")
            continue
        if record.time is None:
            mapped.reject(f"claude_code.{name} without a time (event.timestamp or time_unix_nano)")
            continue
        call_id = text(record.attributes.get("tool_use_id"))
        if name in ("tool_result", "tool_decision") and call_id is None:
            mapped.reject(f"claude_code.{name} without tool_use_id")
            continue
        at = record.time
        why = unstorable(record.attributes) if name == "api_request" else None
        if why is not None:
            mapped.reject(why)
            continue
        prompt = text(record.attributes.get("prompt.id"))
        session_id = emitter.session(CLAUDE_CODE, session_key, tags, at)
        if name == "user_prompt":
            emitter.turn(CLAUDE_CODE, session_key, prompt or NO_PROMPT, tags, at)
            emitter.saw(CLAUDE_CODE, session_key, prompt or NO_PROMPT, tags, at, prompt=prompt is not None)
        elif name == "api_request" or call_id is None:
            turn_id = None
            if prompt:
                turn_id = emitter.turn(CLAUDE_CODE, session_key, prompt, tags, at)
                emitter.saw(CLAUDE_CODE, session_key, prompt, tags, at, prompt=False)
            emitter.add(model_call(record.attributes, session_key, session_id, turn_id, tags, at, emitter))
        else:
            turn_id = emitter.turn(CLAUDE_CODE, session_key, prompt or NO_PROMPT, tags, at)
            emitter.saw(CLAUDE_CODE, session_key, prompt or NO_PROMPT, tags, at, prompt=False)
            place = CallAt(CLAUDE_CODE, session_key, session_id, turn_id, call_id, at)
            if name == "tool_result":
                emitter.add(tool_call(record.attributes, place, emitter))
            else:
                emitter.add(approval(record.attributes, place, emitter))
    # Records of no event (``assistant_response``, ``api_error``, ...) of a turn this request has: its latest
    # record may be one of them.
    for session_key, prompt, at in others:
        seen = emitter.turns_seen_of(CLAUDE_CODE, session_key)
        if seen is not None and seen.turn(prompt) is not None:
            emitter.saw(CLAUDE_CODE, session_key, prompt, tags, at, prompt=False)


def model_call(
    attrs: dict[str, Any],
    session_key: str,
    session_id: uuid.UUID,
    turn_id: uuid.UUID | None,
    tags: tuple[str, ...],
    at: datetime,
    emitter: Emitter,
) -> ModelCallCompleted:
    request_id = text(attrs.get("request_id"))
    if request_id is not None:
        event_id = request_call_event_id(emitter.scope(CLAUDE_CODE), request_id)
    else:
        sequence = integer(attrs.get("event.sequence"))
        event_id = gateway_id(
            "model_call_completed",
            emitter.scope(CLAUDE_CODE),
            session_key,
            text(attrs.get("prompt.id")) or "",
            str(sequence) if sequence is not None else "",
            at.isoformat(),
        )
    one_hour = count(attrs.get("cache_creation_1h_tokens"))
    if "cache_creation_5m_tokens" in attrs:
        five_minutes = count(attrs.get("cache_creation_5m_tokens"))
    else:
        five_minutes = max(0, count(attrs.get("cache_creation_tokens")) - one_hour)
    duration = number(attrs.get("duration_ms"))
    speed = text(attrs.get("speed"))
    return ModelCallCompleted(
        event_id=event_id,
        occurred_at=at,
        profile_id=emitter.source.profile_id,
        session_id=session_id,
        turn_id=turn_id,
        provider=PROVIDER,
        model=text(attrs.get("model")) or "unknown",
        request_id=request_id,
        input_tokens=count(attrs.get("input_tokens")),
        output_tokens=count(attrs.get("output_tokens")),
        cache_read_tokens=count(attrs.get("cache_read_tokens")),
        cache_write_5m_tokens=five_minutes,
        cache_write_1h_tokens=one_hour,
        speed=SPEEDS.get(speed) if speed is not None else None,
        latency_s=duration / 1000 if duration is not None and duration >= 0 else None,
        tags=tags,
        reported_cost_usd=_cost(attrs.get("cost_usd")),
    )


def tool_call(attrs: dict[str, Any], at: CallAt, emitter: Emitter) -> ToolCallRecorded:
    failed = boolean(attrs.get("success")) is False
    return emitter.tool_call(
        at,
        name=text(attrs.get("tool_name")) or "unknown",
        args=json_object(attrs.get("tool_parameters")),
        result=text(attrs.get("error")) if failed else None,
        is_error=failed,
        started_at=before(at.at, attrs.get("duration_ms")),
    )


def approval(attrs: dict[str, Any], at: CallAt, emitter: Emitter) -> ApprovalDecided:
    return emitter.approval(
        at, approved=text(attrs.get("decision")) == "accept", decided_by=decided_by(text(attrs.get("source")))
    )

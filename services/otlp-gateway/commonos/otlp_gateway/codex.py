"""Codex's OpenTelemetry log events -> our events (pure: no I/O but the `CallOrdinals` store it is given).

Codex (``[otel]`` in ``~/.codex/config.toml``, ``exporter = { otlp-http = … }``) logs one record per
event in the scope ``codex_otel.log_only``; the name is the ``event.name`` attribute (``codex.*``),
the time its ``event.timestamp`` (``time_unix_nano`` is 0), and every record carries
``conversation.id`` and ``model``. Checked against Codex 0.171.0's recorded payloads
(tests/fixtures/clients/codex-0.171.0).

======================================  ==================================================================
Codex record / attribute                our event / field
======================================  ==================================================================
``conversation.id``                     session ``mint_id("session", scope, conversation.id)`` (the
                                        importer's session of the same rollout); ``session_created``
                                        (source ``codex``, tags = the resource's + ``vendor:codex``) once
                                        per request
``codex.conversation_starts``           ``session_created`` only
``codex.user_prompt``                   turn ``gateway_id("turn", scope, conversation.id, <its time>)``,
                                        ``turn_started`` at its time (the prompt's text is not stored)
``codex.sse_event`` with                ``model_call_completed``, id ``usage_call_event_id(scope,
``event.kind=response.completed``       conversation.id, usage, n)``: the importer's for the same call of
and token counts (some above 0)         the rollout (see below)
  ``input_token_count``                   ``input_tokens`` = it − ``cached_token_count`` −
                                          ``cache_write_token_count`` (Codex's input is the whole prompt)
  ``cached_token_count``                  ``cache_read_tokens``
  ``cache_write_token_count``             ``cache_write_5m_tokens`` (as the importer counts it)
  ``output_token_count``                  ``output_tokens`` (reasoning included, as our convention)
  ``reasoning_token_count``               ``reasoning_tokens``; added to the output only when the figures
                                          show it outside (reasoning > output, or ``tool_token_count`` =
                                          input + output + reasoning), as the importer decides
  ``model``                               ``model``; provider ``openai``
  record time                             ``occurred_at``
  the turn begun last before it           ``turn_id``
``codex.tool_result``                   ``tool_call_recorded`` (``call_id``, ``tool_name``, ``arguments``
                                        -> ``args`` (a JSON object; else ``{"input": …}``; ``{}`` over
                                        64 KiB: `attributes.json_object`), ``output`` ->
                                        ``result`` (cut to 16,000 characters, ``result_bytes`` then
                                        the whole size), ``is_error`` = not ``success``, ``finished_at`` =
                                        its time, ``started_at`` = that less ``duration_ms``, or that
                                        time itself when the duration is missing, not above 0, or
                                        reaches before the year 1)
``codex.tool_decision``                 ``approval_decided`` (``approved``/``approved_for_session`` ->
                                        ``approved``, else ``denied``; ``decided_by`` ``policy`` for
                                        ``source=Config``, ``user`` for ``User``, else the source)
anything else (``codex.api_request``,   ignored (counted), never an error; so is a ``response.completed``
``codex.sse_event`` of other kinds,     without token counts (Codex logs each completed response twice,
``codex.turn_ttft``, …)                 once without and once with them)
======================================  ==================================================================

Decisions:

* **Model call ids, whatever the order, and which source wins.** Codex's telemetry names neither the
  request nor the response, and carries no sequence number: a ``response.completed`` record has its
  conversation, its time and its token counts. The rollout has the same conversation and counts (its
  times are its own). So a call's id is ``usage_call_event_id(scope, conversation, usage, n)``: *usage* its
  ``(input, output, cache_read, cache_write)`` in our buckets, *n* how many calls of the conversation with
  the very same usage were seen before it (0 but for a repeat, which input that grows with the context
  makes rare). The importer mints it alike, *n* counted in the rollout's order. No id depends on the order
  in which records arrive, on which replica receives them, or on a store that was lost, but for a repeated
  usage: the gateway counts the distinct records (time and counts, `fingerprint`) of one usage in the
  order it first sees them, kept by `CallOrdinals` across replicas and retries, so two calls of one
  usage may swap their *n* (and so their ids) between the gateway and the import; the set of ids is the
  same, and each call, of identical tokens, is billed once either way. (*scope*, here and in the table,
  is ``vendor_scope("codex", profile)``: ``codex`` for the profile ``codex``, ``codex@<profile>`` for any
  other; see :mod:`~commonos.otlp_gateway.common`.) Both sources carry the same tokens (tested on the
  recorded sessions), and the first stored wins (JetStream's duplicate window, then billing's
  ``ON CONFLICT (event_id)``); the OTLP event has the turn, the imported one the response id (as
  ``request_id``). A rollout holding calls that Codex did not log under that conversation (were a forked
  session's rollout to copy its parent's calls, as none of the recorded scenarios shows) would still
  bill those calls twice: import or receive such sessions one way only.
  **Upgrading:** ids were the call's place among its conversation's calls before; a conversation received
  over OTLP by an earlier version and imported by this one is billed twice (its OTLP calls carry no
  request id for billing to match): import those with the earlier version, or not at all.
* **Each profile its own ids**, as for Claude Code: two profiles sending the same conversation have
  two sessions, and count their calls apart; give the gateway's token the import's profile (``codex``
  by default) for the ids of a conversation received here and imported to agree.
* **Turns** are the prompts, keyed by the prompt's time (Codex gives a prompt no id, and its rollout's
  turn ids are not in the telemetry: the importer cannot mint the same turn, and its calls have none). A
  record that names no turn belongs to the turn of the latest ``codex.user_prompt`` at or before its time,
  among the prompts of its own request (read first, whatever the order of the records) and those the
  store knows from earlier requests (`SessionTurns.turn_at`); a record arriving before any earlier
  request with its prompt is mapped (an exporter's request overtaken by a later one) follows the latest
  prompt known then. A model call before any known prompt has no turn; a tool call before any gets the
  session's ``no-prompt`` turn (a tool call needs one). Codex logs no end of a turn: the gateway's
  sweeper ends them (the next prompt, or ``COS_OTLP_TURN_IDLE_S`` without a record, status
  ``interrupted``: :mod:`~commonos.otlp_gateway.turns`). A conversation resumed in a new process (``codex
  exec resume``) continues its session and turns; a call Codex makes before the new prompt (a compaction)
  counts in the previous turn.
* **Approvals** are ``approval_decided`` events (see :mod:`commonos.otlp_gateway.claude_code`: the
  decision may come in another request than the result); the tool call's ``approval`` stays empty.
* A mapped record without ``conversation.id`` or without a time is refused (partial success), with why;
  so is a call billing could not store (a model name longer than 256 characters, a count beyond 64
  bits), before it takes an ordinal. A time no UTC datetime holds is no time (`attributes.timestamp`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final, NamedTuple

from commonos.otlp_gateway.attributes import before, boolean, count, json_object, text
from commonos.otlp_gateway.common import CallAt, CallOrdinals, Emitter, Mapped, Record
from commonos.otlp_gateway.turns import merge
from commonos.proto.events import MAX_COUNT, MAX_NAME_CHARS, ApprovalDecided, ModelCallCompleted, ToolCallRecorded
from commonos.proto.graph.ids import usage_call_event_id
from commonos.proto.vendors import CODEX

#: The pricing provider of Codex's models.
PROVIDER: Final = "openai"
#: A tool call's turn when no prompt of its conversation is known before it.
NO_PROMPT: Final = "no-prompt"
#: A tool's output kept in `result` (characters); beyond it the result is cut and `result_bytes` says how big.
MAX_RESULT_CHARS: Final = 16_000
APPROVED: Final = frozenset({"approved", "approved_for_session", "accept", "accepted"})
MAPPED: Final = frozenset(
    {"codex.conversation_starts", "codex.user_prompt", "codex.sse_event", "codex.tool_result", "codex.tool_decision"}
)
_COUNTS: Final = (
    "input_token_count",
    "output_token_count",
    "cached_token_count",
    "cache_write_token_count",
    "reasoning_token_count",
)


def has_usage(attrs: dict[str, Any]) -> bool:
    """A ``response.completed`` record with token counts, some above 0: one model call."""
    return text(attrs.get("event.kind")) == "response.completed" and any(count(attrs.get(k)) > 0 for k in _COUNTS)


def decided_by(source: str | None) -> str:
    lowered = (source or "").lower()
    if lowered == "config":
        return "policy"
    if lowered == "user":
        return "user"
    return lowered or "unknown"


def turn_key(started: datetime) -> str:
    """A Codex turn's key: its prompt's time (Codex gives the prompt no id)."""
    return started.isoformat()


def _turn_start(key: str, fallback: datetime) -> datetime:
    try:
        return datetime.fromisoformat(key)
    except ValueError:
        return fallback


class _Valid(NamedTuple):
    """A mapped record that passed the checks: its conversation, name, call id and time."""

    record: Record
    conversation: str
    name: str
    call_id: str | None
    at: datetime


def _checked(records: list[Record], mapped: Mapped) -> list[_Valid]:
    """The records to map, in their order; the others counted ignored or refused (with why)."""
    out = []
    for record in records:
        attrs = record.attributes
        name = record.name
        if name not in MAPPED or (name == "codex.sse_event" and not has_usage(attrs)):
            mapped.ignored += 1
            continue
        conversation = text(attrs.get("conversation.id"))
        if conversation is None:
            mapped.reject(f"{name} without conversation.id")
            continue
        if record.time is None:
            mapped.reject(f"{name} without a time (event.timestamp or time_unix_nano)")
            continue
        call_id = text(attrs.get("call_id"))
        if name in ("codex.tool_result", "codex.tool_decision") and call_id is None:
            mapped.reject(f"{name} without call_id")
            continue
        why = unstorable(attrs) if name == "codex.sse_event" else None
        if why is not None:  # before its ordinal: a refused call takes no place among the calls
            mapped.reject(why)
            continue
        out.append(_Valid(record, conversation, name, call_id, record.time))
    return out


async def map_records(records: list[Record], tags: tuple[str, ...], emitter: Emitter, ordinals: CallOrdinals) -> None:
    """Add the events of one resource's Codex records to `emitter`: per conversation, its prompts first
    (so that a record finds its turn whatever the order of the records in the request), then the others
    in their order."""
    conversations: dict[str, list[_Valid]] = {}
    for checked in _checked(records, emitter.mapped):
        conversations.setdefault(checked.conversation, []).append(checked)
    for conversation, valid in conversations.items():
        emitter.session(CODEX, conversation, tags, valid[0].at)
        stored = await ordinals.turns_of(CODEX, emitter.source.profile_id, conversation)
        for v in valid:
            if v.name == "codex.user_prompt":
                key = turn_key(v.at)
                emitter.turn(CODEX, conversation, key, tags, v.at)
                emitter.saw(CODEX, conversation, key, tags, v.at, prompt=True)
        seen = emitter.turns_seen_of(CODEX, conversation)
        known = merge(stored, seen) if stored is not None and seen is not None else (stored or seen)
        for v in valid:
            if v.name in ("codex.user_prompt", "codex.conversation_starts"):
                continue
            await _map_one(v, known.turn_at(v.at) if known is not None else None, tags, emitter, ordinals)


async def _map_one(
    v: _Valid, key_at: str | None, tags: tuple[str, ...], emitter: Emitter, ordinals: CallOrdinals
) -> None:
    conversation, at = v.conversation, v.at
    session_id = emitter.session(CODEX, conversation, tags, at)
    if v.name == "codex.sse_event":
        turn_id = None
        if key_at is not None:
            turn_id = emitter.turn(CODEX, conversation, key_at, tags, _turn_start(key_at, at))
            emitter.saw(CODEX, conversation, key_at, tags, at, prompt=False)
        emitter.add(
            await model_call(v.record.attributes, conversation, session_id, turn_id, tags, at, emitter, ordinals)
        )
        return
    assert v.call_id is not None
    key = key_at or NO_PROMPT
    turn_id = emitter.turn(CODEX, conversation, key, tags, _turn_start(key, at))
    emitter.saw(CODEX, conversation, key, tags, at, prompt=False)
    place = CallAt(CODEX, conversation, session_id, turn_id, v.call_id, at)
    if v.name == "codex.tool_result":
        emitter.add(tool_call(v.record.attributes, place, emitter))
    else:
        emitter.add(approval(v.record.attributes, place, emitter))


class Usage(NamedTuple):
    """A call's tokens in our disjoint buckets."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_5m_tokens: int
    reasoning_tokens: int


def unstorable(attrs: dict[str, Any]) -> str | None:
    """Why billing could not store a ``response.completed``'s call (None when it can)."""
    model = text(attrs.get("model")) or text(attrs.get("slug"))
    if model is not None and len(model) > MAX_NAME_CHARS:
        return f"codex.sse_event with a model name longer than {MAX_NAME_CHARS} characters"
    if max(usage(attrs)) > MAX_COUNT:
        return "codex.sse_event with a token count beyond 64 bits"
    return None


def usage(attrs: dict[str, Any]) -> Usage:
    """A call's tokens in our disjoint buckets (see the module's table)."""
    cached = count(attrs.get("cached_token_count"))
    written = count(attrs.get("cache_write_token_count"))
    whole_input = count(attrs.get("input_token_count"))
    output = count(attrs.get("output_token_count"))
    reasoning = count(attrs.get("reasoning_token_count"))
    total = count(attrs.get("tool_token_count"))
    if reasoning and (reasoning > output or total == whole_input + output + reasoning):
        output += reasoning  # the figures show reasoning reported beside the output, not in it
    return Usage(max(0, whole_input - cached - written), output, cached, written, reasoning)


def fingerprint(attrs: dict[str, Any], at: datetime) -> str:
    """What tells one call from another of the same usage: its time and its counts as sent."""
    return "|".join([at.isoformat(), *(str(count(attrs.get(k))) for k in (*_COUNTS, "tool_token_count"))])


def usage_key(tokens: Usage) -> tuple[int, int, int, int]:
    """The usage a call's id is minted from: ``(input, output, cache_read, cache_write)`` in our buckets,
    as the importer reads them from the rollout (`usage_call_event_id`)."""
    return (tokens.input_tokens, tokens.output_tokens, tokens.cache_read_tokens, tokens.cache_write_5m_tokens)


async def model_call(
    attrs: dict[str, Any],
    conversation: str,
    session_id: uuid.UUID,
    turn_id: uuid.UUID | None,
    tags: tuple[str, ...],
    at: datetime,
    emitter: Emitter,
    ordinals: CallOrdinals,
) -> ModelCallCompleted:
    scope = emitter.scope(CODEX)
    tokens = usage(attrs)
    key = usage_key(tokens)
    # Calls of the very same usage in one conversation (rare): the n-th distinct one seen is occurrence n.
    occurrence = await ordinals.ordinal(scope, _usage_session(conversation, key), fingerprint(attrs, at))
    return ModelCallCompleted(
        event_id=usage_call_event_id(scope, conversation, key, occurrence),
        occurred_at=at,
        profile_id=emitter.source.profile_id,
        session_id=session_id,
        turn_id=turn_id,
        provider=PROVIDER,
        model=text(attrs.get("model")) or text(attrs.get("slug")) or "unknown",
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        cache_read_tokens=tokens.cache_read_tokens,
        cache_write_5m_tokens=tokens.cache_write_5m_tokens,
        reasoning_tokens=tokens.reasoning_tokens,
        tags=tags,
    )


def _usage_session(conversation: str, key: tuple[int, int, int, int]) -> str:
    """The `CallOrdinals` key counting a conversation's calls of usage `key`."""
    return f"{conversation}\n{'/'.join(map(str, key))}"


def _result(value: Any) -> tuple[str | None, int | None]:
    """The output kept, and its whole size in bytes when it was cut."""
    if not isinstance(value, str):
        return None, None
    if len(value) <= MAX_RESULT_CHARS:
        return value, None
    return value[:MAX_RESULT_CHARS], len(value.encode())


def tool_call(attrs: dict[str, Any], at: CallAt, emitter: Emitter) -> ToolCallRecorded:
    result, whole = _result(attrs.get("output"))
    return emitter.tool_call(
        at,
        name=text(attrs.get("tool_name")) or "unknown",
        args=json_object(attrs.get("arguments"), "input"),
        result=result,
        result_bytes=whole,
        is_error=boolean(attrs.get("success")) is False,
        started_at=before(at.at, attrs.get("duration_ms")),
    )


def approval(attrs: dict[str, Any], at: CallAt, emitter: Emitter) -> ApprovalDecided:
    decision = (text(attrs.get("decision")) or "").lower()
    return emitter.approval(at, approved=decision in APPROVED, decided_by=decided_by(text(attrs.get("source"))))

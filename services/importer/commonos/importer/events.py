"""Imported session trees -> events (pure: nothing here does I/O).

Per tree the importer publishes:

* ``transcript_imported`` events carrying its graph (see ``TranscriptImported``). A NATS message
  holds at most the server's max_payload, headers included (1 MiB by default). A graph whose event
  fits one message is published as one self-contained part. A larger graph is published as
  consecutive parts (``part`` 1 to ``parts``, ``self_contained`` false), each at most
  :func:`~commonos.importer.parts.part_budget` bytes with its headers (256 KiB, or half of a smaller
  max_payload); how its rows are split is :mod:`commonos.importer.parts`. A part refers to rows of
  earlier parts; the graph-writer stores them in stream order, so it has them. How large a session
  is therefore does not matter.
* A watcher (``state``) publishes only the rows that are new or changed, in parts that refer to rows
  it published before.
* one ``model_call_completed`` per model invocation with usage, for billing.

Every event id is deterministic: a part's id is a UUIDv5 of (vendor, root session, SHA-256 of the
part's graph, and its place when there are several); a model call's is the one the OTLP gateway
mints for the same call (`call_event_ids`: Claude Code's API request id, a Codex call's conversation and
usage, else the invocation id), so a session received over OpenTelemetry and later imported from its
transcript bills each call once; a Claude Code call's turn is the gateway's turn of its prompt
(`call_turn_ids`). Importing
an unchanged transcript again therefore publishes the same ids: JetStream drops them as duplicates
within its duplicate window (10 minutes), and after it they are stored again but change nothing,
every consumer being idempotent by event id or natural key; an invocation is never billed twice.

Publishing them is :mod:`commonos.importer.publish`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from commonos.importer.model import ImportedSession
from commonos.importer.parts import (
    GraphRows,
    GraphTooLarge,
    RowKey,
    RowRef,
    part_budget,
    plan_parts,
)
from commonos.importer.vendors import provider_of
from commonos.proto.cloudevents import event_headers
from commonos.proto.events import Event, ModelCallCompleted, TranscriptImported, check_event, encode_event
from commonos.proto.graph import (
    GRAPH_LISTS,
    Graph,
    ModelInvocation,
    Session,
    TokenBasis,
    encode_graph,
    validate,
)
from commonos.proto.graph.ids import (
    model_call_event_id,
    request_call_event_id,
    usage_call_event_id,
    vendor_scope,
    vendor_turn_id,
)
from commonos.proto.ids import IMPORT_NAMESPACE, name_id
from commonos.proto.subjects import EVENTS_STREAM
from commonos.proto.vendors import CLAUDE_CODE, CODEX
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD, message_bytes, with_stream_header

#: CloudEvents ``source`` of everything the importer publishes.
EVENT_SOURCE: Final = "urn:commonos:importer"
#: Parts are sized as if numbered up to this: the digits of `part` and `parts` are counted too.
_MAX_PARTS: Final = 999_999_999
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_TAG_VALUE_BAD: Final = re.compile(r"[^A-Za-z0-9_.-]+")
_PROFILE_BAD: Final = re.compile(r"[^a-z0-9_-]+")
_MAX_TAG_VALUE: Final = 200
_LISTS: Final = GRAPH_LISTS


# --- tags and identity ---------------------------------------------------------------------------


def tag_value(text: str | None) -> str | None:
    """``text`` in the tag-value alphabet ``[A-Za-z0-9_.-]``: other runs become ``-``; None if nothing is left."""
    if not text:
        return None
    value = _TAG_VALUE_BAD.sub("-", text.strip())[:_MAX_TAG_VALUE]
    return value if value.strip("-") else None


def profile_id_for(vendor: str) -> str:
    """The profile imported work belongs to by default: the vendor's name (``claude-code``, ``codex``)."""
    profile = _PROFILE_BAD.sub("-", vendor.lower()).strip("-")[:64]
    return profile or "imported"


def profile_of(imported: ImportedSession) -> str:
    """The profile a tree is imported into: the one ``cos import --profile`` named, else the vendor's."""
    return imported.profile_id or profile_id_for(imported.vendor)


def profile_tags(vendor: str) -> tuple[str, ...]:
    """The tags of an import profile's ``profile_upserted``: ``vendor:<vendor>``."""
    return (f"vendor:{tag_value(vendor) or 'unknown'}",)


def import_tags(imported: ImportedSession) -> tuple[str, ...]:
    """``vendor:<vendor>``, ``project:<folder>`` and, where known, ``branch:<git branch>``."""
    tags = [f"vendor:{tag_value(imported.vendor) or 'unknown'}"]
    project = tag_value(imported.project)
    if project is not None:
        tags.append(f"project:{project}")
    branch = tag_value(imported.branch)
    if branch is not None:
        tags.append(f"branch:{branch}")
    return tuple(tags)


def _event_id(*parts: str) -> uuid.UUID:
    return name_id(IMPORT_NAMESPACE, *parts)


def vendor_session_key(graph: Graph) -> str | None:
    """The vendor's id of the tree's top-level session (Claude Code's session id, Codex's conversation id)."""
    root = graph.root()
    if root is None:
        return None
    return next(
        (
            v.vendor_id
            for v in graph.vendor_ids
            if v.our_type == "session" and v.our_id == root.id and v.vendor_id_kind == "session_id"
        ),
        None,
    )


def call_event_ids(imported: ImportedSession) -> dict[str, uuid.UUID]:
    """The ``model_call_completed`` id of each invocation with usage, the one the OTLP gateway mints too.

    * Claude Code: a call whose lines carry the API request id (``requestId``) is
      ``request_call_event_id(scope, request_id)``, as the gateway names the ``api_request``
      event of that request; a call without one keeps ``model_call_event_id(invocation id)``.
    * Codex: ``usage_call_event_id(scope, conversation id, usage, n)``, *usage* being the call's
      ``(input, output, cache_read, cache_write)`` and *n* how many calls of the rollout with the very same
      usage come before it (0 but for a repeat): Codex's telemetry names no call, and what its
      ``response.completed`` records and the rollout both carry is the conversation and the tokens. The
      gateway counts calls of the same usage the same way (the n-th distinct record), so whatever the
      order in which either reads them, the two name the same set of calls alike.
    * Any other vendor: ``model_call_event_id(invocation id)``.

    *scope* is `vendor_scope` of the vendor and the import's profile: the vendor's
    name for its default profile, ``<vendor>@<profile>`` for another (``cos import --profile``), as the
    gateway mints it for a token of that profile.
    """
    graph = imported.graph
    with_usage = [m for m in graph.model_invocations if has_usage(m)]
    scope = vendor_scope(imported.vendor, profile_of(imported))
    if imported.vendor == CLAUDE_CODE:
        request_ids = {
            v.our_id: v.vendor_id
            for v in graph.vendor_ids
            if v.our_type == "model_invocation" and v.vendor_id_kind == "request_id"
        }
        return {
            m.id: request_call_event_id(scope, request_ids[m.id]) if m.id in request_ids else model_call_event_id(m.id)
            for m in with_usage
        }
    session_key = vendor_session_key(graph) if imported.vendor == CODEX else None
    if session_key is not None:
        seen: Counter[tuple[int, int, int, int]] = Counter()
        out = {}
        for m in with_usage:
            usage = (m.input_tokens, m.output_tokens, m.cache_read_tokens, m.cache_write_tokens)
            out[m.id] = usage_call_event_id(scope, session_key, usage, seen[usage])
            seen[usage] += 1
        return out
    return {m.id: model_call_event_id(m.id) for m in with_usage}


def call_turn_ids(imported: ImportedSession) -> dict[str, uuid.UUID]:
    """The turn of each invocation whose prompt the transcript names: the OTLP gateway's turn of that prompt.

    Claude Code names each prompt on its transcript's lines (``promptId``) and in its telemetry
    (``prompt.id``): a call of a prompt of the tree's own session is in ``vendor_turn_id(scope, session id,
    prompt id)``, the turn the gateway records for the prompt, so the call has the same turn whichever of
    the two sources is stored first. Codex's rollouts and telemetry share no prompt id: its calls have no
    turn here (the gateway's have its turn).
    """
    session_key = vendor_session_key(imported.graph)
    if session_key is None or not imported.input_prompts:
        return {}
    scope = vendor_scope(imported.vendor, profile_of(imported))
    out = {}
    for m in imported.graph.model_invocations:
        prompt = imported.input_prompts.get(m.user_input_id)
        if prompt is not None and prompt[0] == session_key:
            out[m.id] = vendor_turn_id(scope, session_key, prompt[1])
    return out


def _root(imported: ImportedSession) -> Session:
    root = imported.graph.root()
    if root is None:
        raise ValueError(f"{imported.source_path}: the imported graph has no top-level session")
    return root


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


# --- model calls ---------------------------------------------------------------------------------


def has_usage(invocation: ModelInvocation) -> bool:
    """An invocation the vendor reported tokens for (Codex items before any token count have none)."""
    return (
        invocation.input_tokens
        + invocation.output_tokens
        + invocation.cache_read_tokens
        + invocation.cache_write_tokens
        > 0
    )


def call_time(graph: Graph, invocation: ModelInvocation) -> datetime:
    """When the call was made: its start, else its session's, else the tree's, else the epoch."""
    sessions = {s.id: s for s in graph.sessions}
    own = sessions.get(invocation.session_id)
    root = graph.root()
    for moment in (invocation.started_at, own.started_at if own else None, root.started_at if root else None):
        aware = _aware(moment)
        if aware is not None:
            return aware
    return _EPOCH


def settled_invocations(graph: Graph) -> set[str]:
    """Invocations whose usage is final: one with a stop reason, or followed by another in its session.

    Claude Code writes a response one content block per line, each repeating the usage so far; the
    last response of a file still being written may be partial. A watcher bills the rest once the
    file has been quiet for a while.
    """
    last_of_session: dict[str, ModelInvocation] = {}
    for invocation in graph.model_invocations:
        last_of_session[invocation.session_id] = invocation
    unsettled = {m.id for m in last_of_session.values() if m.stop_reason is None}
    return {m.id for m in graph.model_invocations if m.id not in unsettled}


def model_call_events(
    imported: ImportedSession, *, only: Iterable[str] | None = None, skip: Iterable[str] = ()
) -> list[ModelCallCompleted]:
    """One ``model_call_completed`` per invocation with usage (restricted to ``only``, minus ``skip``)."""
    graph = imported.graph
    root = _root(imported)
    tags = import_tags(imported)
    profile = profile_of(imported)
    provider = provider_of(imported.vendor)
    wanted = set(only) if only is not None else None
    skipped = set(skip)
    # The API's id of the call's request: Claude Code's requestId; for the Responses API (Codex) the response
    # id, as the loop's OpenAI provider records it. Billing counts one (provider, request id) once.
    request_ids: dict[str, str] = {}
    for kind in ("response_id", "request_id"):  # a request id, where both are known, wins
        request_ids.update(
            (v.our_id, v.vendor_id)
            for v in graph.vendor_ids
            if v.our_type == "model_invocation" and v.vendor_id_kind == kind and v.vendor_id
        )
    event_ids = call_event_ids(imported)
    turn_ids = call_turn_ids(imported)
    events = []
    for invocation in graph.model_invocations:
        if (
            not has_usage(invocation)
            or invocation.id in skipped
            or (wanted is not None and invocation.id not in wanted)
        ):
            continue
        one_hour = invocation.cache_write_1h_tokens or 0
        events.append(
            ModelCallCompleted(
                event_id=event_ids[invocation.id],
                occurred_at=call_time(graph, invocation),
                profile_id=profile,
                session_id=uuid.UUID(root.id),
                turn_id=turn_ids.get(invocation.id),
                provider=provider,
                model=invocation.model or "unknown",
                request_id=request_ids.get(invocation.id),
                input_tokens=invocation.input_tokens,
                output_tokens=invocation.output_tokens,
                cache_read_tokens=invocation.cache_read_tokens,
                cache_write_5m_tokens=invocation.cache_write_tokens - one_hour,
                cache_write_1h_tokens=one_hour,
                reasoning_tokens=invocation.reasoning_tokens or 0,
                speed=invocation.speed,
                stop_reason=invocation.stop_reason,
                tags=tags,
                usage_estimated=invocation.token_basis == TokenBasis.ESTIMATED,
            )
        )
    return events


def message_size(event: TranscriptImported | ModelCallCompleted) -> int:
    """What the server counts against max_payload for `event` as the importer publishes it."""
    headers = with_stream_header(event_headers(event, EVENT_SOURCE), EVENTS_STREAM)
    return message_bytes(encode_event(event), headers)


# --- events --------------------------------------------------------------------------------------


@dataclass
class TreeState:
    """What has been published for one tree in this process, so a watcher sends only what changed."""

    digests: dict[RowKey, bytes] = field(default_factory=dict)
    billed: set[str] = field(default_factory=set)

    def changed(self, rows: GraphRows, list_name: str, index: int) -> bool:
        return self.digests.get(rows.key(list_name, index)) != rows.digest(list_name, index)

    def remember(self, published: TreeEvents) -> None:
        """Record a tree's events as published (call it only after every PubAck arrived)."""
        rows = published.rows
        for name in _LISTS:
            for index in range(len(rows.lists[name])):
                self.digests[rows.key(name, index)] = rows.digest(name, index)
        self.billed.update(published.invocation_of[c.event_id] for c in published.calls)


def _moment(root: Session) -> datetime:
    return _aware(root.ended_at) or _aware(root.started_at) or datetime.now(UTC)


def transcript_event(
    imported: ImportedSession,
    graph: Graph,
    *,
    occurred_at: datetime | None = None,
    part: int = 1,
    parts: int = 1,
    self_contained: bool = True,
) -> TranscriptImported:
    """The ``transcript_imported`` of one part, with a deterministic id.

    The id is a UUIDv5 of the vendor, the root session and the SHA-256 of the part's graph, and for a
    part of several also of its place (``part/parts``).
    """
    root = _root(imported)
    digest = hashlib.sha256(encode_graph(graph)).hexdigest()
    place = () if self_contained and parts == 1 else (f"{part}/{parts}",)
    return TranscriptImported(
        event_id=_event_id("transcript_imported", imported.vendor, root.id, digest, *place),
        occurred_at=occurred_at or _moment(root),
        profile_id=profile_of(imported),
        session_id=uuid.UUID(root.id),
        vendor=imported.vendor,
        source_ref=str(imported.source_path),
        tags=import_tags(imported),
        graph=graph,
        part=part,
        parts=parts,
        self_contained=self_contained,
    )


def part_events(
    imported: ImportedSession,
    rows: GraphRows,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    selected: set[RowRef] | None = None,
) -> tuple[list[TranscriptImported], int]:
    """The ``transcript_imported`` events of a tree's graph (or of its `selected` rows), and how many rows were cut.

    The whole graph is one self-contained event when that event fits one message of the server
    (headers included). Otherwise, and always for a selection, the rows go in consecutive parts of
    at most `part_budget(max_payload)` bytes each, headers included (see `plan_parts`).
    """
    moment = _moment(_root(imported))
    if selected is None:
        empty = transcript_event(imported, Graph(), occurred_at=moment)
        total = sum(rows.size(*ref) for ref in rows.refs())
        # The sum of the rows' sizes is within a few bytes of the graph's; build the event only if it may fit.
        if message_size(empty) + total <= max_payload + len(_LISTS):
            whole = transcript_event(imported, rows.graph, occurred_at=moment)
            if message_size(whole) <= max_payload:
                return [whole], 0
    elif not selected:
        return [], 0
    budget = part_budget(max_payload)
    widest = transcript_event(
        imported, Graph(), occurred_at=moment, part=_MAX_PARTS, parts=_MAX_PARTS, self_contained=False
    )
    plan = plan_parts(rows, capacity=budget - message_size(widest), selected=selected)
    events = [
        transcript_event(imported, graph, occurred_at=moment, part=number, parts=len(plan.graphs), self_contained=False)
        for number, graph in enumerate(plan.graphs, start=1)
    ]
    for event in events:
        size = message_size(event)
        if size > budget:  # the sizes above are exact or over; never publish what the budget refuses
            raise GraphTooLarge(
                f"part {event.part} of {imported.source_path} takes {size} bytes, over its budget of {budget}"
            )
    return events, plan.cut_rows


@dataclass
class TreeEvents:
    """The events of one tree, and what to remember once they are published."""

    parts: list[TranscriptImported]
    calls: list[ModelCallCompleted]
    rows: GraphRows
    invocation_of: dict[uuid.UUID, str]
    #: Rows whose large fields were cut so that they fit a part (see `cut`).
    cut_rows: int = 0

    @property
    def events(self) -> list[Event]:
        return [*self.parts, *self.calls]


def tree_events(
    imported: ImportedSession,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    settled_only: bool = False,
    state: TreeState | None = None,
) -> TreeEvents:
    """The events to publish for one tree.

    ``state`` (a watcher's memory of what it published) limits the graph parts to the rows that are
    new or changed, which may refer to rows published before, and the model calls to those not
    billed yet; ``settled_only`` leaves out the calls whose usage may still grow (see
    :func:`settled_invocations`). Raises `EventInvalid` for a model call outside the contract's bounds
    (a model name longer than `MAX_NAME_CHARS`, ...): the tree is not imported, with that reason.
    """
    graph = imported.graph
    validate(graph)
    rows = GraphRows(graph)
    selected: set[RowRef] | None = None
    if state is not None:
        changed = [ref for ref in rows.refs() if state.changed(rows, *ref)]
        if len(changed) < sum(len(v) for v in rows.lists.values()):
            selected = set(changed)
    parts, cut = part_events(imported, rows, max_payload=max_payload, selected=selected)
    only = settled_invocations(graph) if settled_only else None
    calls = model_call_events(imported, only=only, skip=state.billed if state is not None else ())
    for call in calls:  # values read from the transcript: a call its consumers would refuse is not published
        check_event(call)
    invocation_of = {event_id: invocation for invocation, event_id in call_event_ids(imported).items()}
    return TreeEvents(parts=parts, calls=calls, rows=rows, invocation_of=invocation_of, cut_rows=cut)


def events_for(imported: ImportedSession, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> list[Event]:
    """Every event of one imported tree: its graph in parts, then one model call per invocation with usage."""
    return tree_events(imported, max_payload=max_payload).events

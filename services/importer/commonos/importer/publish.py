"""Imported session trees -> events, and publishing them.

Per tree the importer publishes:

* ``transcript_imported`` events carrying the graph. A NATS message has a size limit (1 MiB by
  default) that a long session's graph exceeds, so the graph is split into parts, each a valid graph
  on its own: every part holds the tree's *spine* (its sessions, user inputs, model invocations and
  the tool calls that spawned nested sessions, with their results), which every other row points
  at, plus a share of the other rows (assistant messages, tool calls with their results and file
  touches, attributes, usage rows, vendor ids), each kept with the rows it references.
* one ``model_call_completed`` per model invocation with usage, for billing.

Every event id is deterministic: a part's id is a UUIDv5 of (vendor, root session, SHA-256 of the
part), a model call's of the invocation id. Importing an unchanged transcript again therefore
publishes the same ids: JetStream drops them as duplicates within its duplicate window (10 minutes),
and after it they are stored again but change nothing, every consumer being idempotent by event id
or natural key; an invocation is never billed twice.

The functions that build events are pure; only :func:`publish_events` does I/O.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from commonos.importer.model import VENDOR_CLAUDE_CODE, VENDOR_CODEX, ImportedSession
from commonos.proto.events import Event, ModelCallCompleted, TranscriptImported, encode_event
from commonos.proto.graph import (
    Graph,
    ModelInvocation,
    Session,
    TokenBasis,
    encode_graph,
    validate,
)

if TYPE_CHECKING:  # a dry run does not load nats
    from nats.js.api import PubAck

#: Pricing provider of each vendor's models (billing's Pricer knows the vendor names too).
VENDOR_PROVIDERS: Final[dict[str, str]] = {VENDOR_CLAUDE_CODE: "anthropic", VENDOR_CODEX: "openai"}
#: NATS's default max_payload; the importer uses the server's own figure when it is connected.
DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024
#: Room left in a message for the headers and the event's own fields around the graph.
_HEADROOM: Final = 8 * 1024
# Changing this namespace would change every imported event id, and re-importing would bill again.
_EVENT_NAMESPACE: Final = uuid.UUID("2b7c4e0a-5d3f-5c61-9f2e-8a1d7b6c9e40")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_TAG_VALUE_BAD: Final = re.compile(r"[^A-Za-z0-9_.-]+")
_PROFILE_BAD: Final = re.compile(r"[^a-z0-9_-]+")
_MAX_TAG_VALUE: Final = 200
# The graph's lists, in the order a part lists them; a part's JSON adds its keys around the rows.
_LISTS: Final = (
    "sessions",
    "attributes",
    "user_inputs",
    "model_invocations",
    "assistant_messages",
    "tool_uses",
    "tool_results",
    "file_touches",
    "token_usage",
    "vendor_ids",
)
_PART_OVERHEAD: Final = 256
_SINGULAR: Final = {
    "sessions": "session",
    "attributes": "session attribute",
    "user_inputs": "user input",
    "model_invocations": "model invocation",
    "assistant_messages": "assistant message",
    "tool_uses": "tool use",
    "tool_results": "tool result",
    "file_touches": "file touch",
    "token_usage": "token usage row",
    "vendor_ids": "vendor id",
}

_row_encoder: Final = msgspec.json.Encoder()


class GraphTooLarge(ValueError):
    """A graph that cannot be split into parts that each fit one message; the message says which rows."""


# --- tags and identity ---------------------------------------------------------------------------


def tag_value(text: str | None) -> str | None:
    """``text`` in the tag-value alphabet ``[A-Za-z0-9_.-]``: other runs become ``-``; None if nothing is left."""
    if not text:
        return None
    value = _TAG_VALUE_BAD.sub("-", text.strip())[:_MAX_TAG_VALUE]
    return value if value.strip("-") else None


def profile_id_for(vendor: str) -> str:
    """The profile imported work belongs to: the vendor's name as a profile id (``claude-code``, ``codex``)."""
    profile = _PROFILE_BAD.sub("-", vendor.lower()).strip("-")[:64]
    return profile or "imported"


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
    return uuid.uuid5(_EVENT_NAMESPACE, msgspec.json.encode(list(parts)).decode())


def model_call_event_id(invocation_id: str) -> uuid.UUID:
    """The id of the ``model_call_completed`` of one invocation: re-imports never bill it twice."""
    return _event_id("model_call_completed", invocation_id)


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
    profile = profile_id_for(imported.vendor)
    provider = VENDOR_PROVIDERS.get(imported.vendor, imported.vendor)
    wanted = set(only) if only is not None else None
    skipped = set(skip)
    request_ids = {
        v.our_id: v.vendor_id
        for v in graph.vendor_ids
        if v.our_type == "model_invocation" and v.vendor_id_kind == "request_id"
    }
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
                event_id=model_call_event_id(invocation.id),
                occurred_at=call_time(graph, invocation),
                profile_id=profile,
                session_id=uuid.UUID(root.id),
                provider=provider,
                model=invocation.model or "unknown",
                request_id=request_ids.get(invocation.id),
                input_tokens=invocation.input_tokens,
                output_tokens=invocation.output_tokens,
                cache_read_tokens=invocation.cache_read_tokens,
                cache_write_5m_tokens=invocation.cache_write_tokens - one_hour,
                cache_write_1h_tokens=one_hour,
                speed=invocation.speed,
                stop_reason=invocation.stop_reason,
                tags=tags,
                usage_estimated=invocation.token_basis == TokenBasis.ESTIMATED,
            )
        )
    return events


# --- graph parts ---------------------------------------------------------------------------------

RowKey = tuple[str, str]


@dataclass
class _Unit:
    """Rows that go into a part together (a row and those of its dependants that need it)."""

    rows: list[tuple[str, int]] = field(default_factory=list)
    size: int = 0


def _row_key(list_name: str, row: Any) -> RowKey:
    if list_name == "vendor_ids":
        natural = [str(row.our_type), row.vendor, row.vendor_id_kind, row.vendor_id]
        return list_name, msgspec.json.encode(natural).decode()
    return list_name, str(row.id)


class GraphRows:
    """A graph's rows with their encodings, sizes and digests, grouped into a spine and units."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.lists: dict[str, list[Any]] = {name: list(getattr(graph, name)) for name in _LISTS}
        self.encoded: dict[str, list[bytes]] = {
            name: [_row_encoder.encode(row) for row in rows] for name, rows in self.lists.items()
        }
        self.spine: list[tuple[str, int]] = []
        self.units: list[_Unit] = []
        self._group()

    def size(self, list_name: str, index: int) -> int:
        return len(self.encoded[list_name][index]) + 1

    def digest(self, list_name: str, index: int) -> bytes:
        return hashlib.blake2b(self.encoded[list_name][index], digest_size=16).digest()

    def key(self, list_name: str, index: int) -> RowKey:
        return _row_key(list_name, self.lists[list_name][index])

    def _group(self) -> None:
        graph = self.graph
        spawners = {s.spawned_by_tool_use_id for s in graph.sessions if s.spawned_by_tool_use_id is not None}
        self.spine += [("sessions", i) for i in range(len(graph.sessions))]
        self.spine += [("user_inputs", i) for i in range(len(graph.user_inputs))]
        self.spine += [("model_invocations", i) for i in range(len(graph.model_invocations))]
        owner_unit: dict[str, _Unit | None] = {}  # entity id -> its unit (None: in the spine)
        for row in graph.sessions:
            owner_unit[row.id] = None
        for u in graph.user_inputs:
            owner_unit[u.id] = None
        for m in graph.model_invocations:
            owner_unit[m.id] = None

        results_of = {r.tool_use_id: i for i, r in enumerate(graph.tool_results)}
        touches_of: dict[str, list[int]] = {}
        loose_touches: list[int] = []
        for i, touch in enumerate(graph.file_touches):
            if touch.tool_use_id is not None and touch.tool_use_id not in spawners:
                touches_of.setdefault(touch.tool_use_id, []).append(i)
            else:
                loose_touches.append(i)

        units: list[_Unit] = []

        def unit_of(*rows: tuple[str, int]) -> _Unit:
            unit = _Unit(rows=list(rows))
            units.append(unit)
            return unit

        for i, attribute in enumerate(graph.attributes):
            owner_unit[attribute.id] = unit_of(("attributes", i))
        for i, message in enumerate(graph.assistant_messages):
            owner_unit[message.id] = unit_of(("assistant_messages", i))
        for i, tool_use in enumerate(graph.tool_uses):
            result = results_of.get(tool_use.id)
            if tool_use.id in spawners:
                self.spine.append(("tool_uses", i))
                owner_unit[tool_use.id] = None
                if result is not None:
                    self.spine.append(("tool_results", result))
                    owner_unit[graph.tool_results[result].id] = None
                continue
            rows = [("tool_uses", i)]
            if result is not None:
                rows.append(("tool_results", result))
            rows += [("file_touches", t) for t in touches_of.get(tool_use.id, [])]
            unit = unit_of(*rows)
            owner_unit[tool_use.id] = unit
            if result is not None:
                owner_unit[graph.tool_results[result].id] = unit
            for t in touches_of.get(tool_use.id, []):
                owner_unit[graph.file_touches[t].id] = unit
        for t in loose_touches:
            owner_unit[graph.file_touches[t].id] = unit_of(("file_touches", t))
        for i, usage in enumerate(graph.token_usage):
            owner_unit[usage.id] = unit_of(("token_usage", i))
        for i, vendor_row in enumerate(graph.vendor_ids):
            owner = owner_unit.get(vendor_row.our_id)
            if owner is None:
                unit_of(("vendor_ids", i))
            else:
                owner.rows.append(("vendor_ids", i))
        for unit in units:
            unit.size = sum(self.size(name, index) for name, index in unit.rows)
        self.units = units

    def part(self, rows: Iterable[tuple[str, int]]) -> Graph:
        """A graph of the given rows, each list in the original (parents-first) order."""
        chosen: dict[str, set[int]] = {name: set() for name in _LISTS}
        for name, index in rows:
            chosen[name].add(index)
        lists: dict[str, Any] = {name: [self.lists[name][i] for i in sorted(chosen[name])] for name in _LISTS}
        return Graph(**lists)


#: Whether a row (list name, index) of a GraphRows must be published.
RowFilter = Callable[[GraphRows, str, int], bool]


def split_graph(graph: Graph, max_bytes: int, changed: RowFilter | None = None) -> list[Graph]:
    """Parts of ``graph`` of at most ``max_bytes`` of JSON each, every one a valid graph on its own.

    With ``changed``, only the units holding a row it accepts are included (and the spine, which
    every part carries); when no row is accepted there is nothing to publish and no part.
    """
    return _split(GraphRows(graph), max_bytes, changed)


def _split(rows: GraphRows, max_bytes: int, changed: RowFilter | None) -> list[Graph]:
    spine_size = _PART_OVERHEAD + sum(rows.size(name, index) for name, index in rows.spine)
    if changed is None:
        units = rows.units
        spine_changed = True
    else:
        units = [u for u in rows.units if any(changed(rows, name, index) for name, index in u.rows)]
        spine_changed = any(changed(rows, name, index) for name, index in rows.spine)
        if not units and not spine_changed:
            return []
    if spine_size > max_bytes:
        raise GraphTooLarge(
            f"the tree's sessions, user inputs and model invocations alone take {spine_size} bytes, "
            f"more than the {max_bytes} bytes a message may hold (raise the NATS server's max_payload)"
        )
    parts: list[list[tuple[str, int]]] = [[]]
    size = spine_size
    for unit in units:
        if spine_size + unit.size > max_bytes:
            name, index = unit.rows[0]
            raise GraphTooLarge(
                f"{_SINGULAR[name]} {rows.key(name, index)[1]} with its dependants takes {unit.size} bytes; with the "
                f"tree's spine ({spine_size} bytes) it exceeds the {max_bytes} bytes a message may hold "
                "(raise the NATS server's max_payload)"
            )
        if size + unit.size > max_bytes and parts[-1]:
            parts.append([])
            size = spine_size
        parts[-1].extend(unit.rows)
        size += unit.size
    return [rows.part([*rows.spine, *part]) for part in parts]


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


def transcript_events(
    imported: ImportedSession, parts: Sequence[Graph], *, occurred_at: datetime | None = None
) -> list[TranscriptImported]:
    """One ``transcript_imported`` per part, each with a deterministic id."""
    root = _root(imported)
    moment = occurred_at or _aware(root.ended_at) or _aware(root.started_at) or datetime.now(UTC)
    events = []
    for part in parts:
        encoded = encode_graph(part)
        digest = hashlib.sha256(encoded).hexdigest()
        events.append(
            TranscriptImported(
                event_id=_event_id("transcript_imported", imported.vendor, root.id, digest),
                occurred_at=moment,
                profile_id=profile_id_for(imported.vendor),
                session_id=uuid.UUID(root.id),
                vendor=imported.vendor,
                source_ref=str(imported.source_path),
                tags=import_tags(imported),
                graph=msgspec.json.decode(encoded),
            )
        )
    return events


@dataclass
class TreeEvents:
    """The events of one tree, and what to remember once they are published."""

    parts: list[TranscriptImported]
    calls: list[ModelCallCompleted]
    rows: GraphRows
    invocation_of: dict[uuid.UUID, str]

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
    new or changed and the model calls to those not billed yet; ``settled_only`` leaves out the
    calls whose usage may still grow (see :func:`settled_invocations`).
    """
    graph = imported.graph
    validate(graph)
    rows = GraphRows(graph)
    budget = max_payload - _HEADROOM
    parts = _split(rows, budget, state.changed if state is not None else None)
    part_events = transcript_events(imported, parts)
    for event in part_events:
        size = len(encode_event(event))
        if size > budget:  # re-encoding raw JSON can grow it slightly; never publish what the server refuses
            raise GraphTooLarge(f"a part of {imported.source_path} encodes to {size} bytes, over {budget}")
    only = settled_invocations(graph) if settled_only else None
    calls = model_call_events(imported, only=only, skip=state.billed if state is not None else ())
    invocation_of = {model_call_event_id(m.id): m.id for m in graph.model_invocations}
    return TreeEvents(parts=part_events, calls=calls, rows=rows, invocation_of=invocation_of)


def events_for(imported: ImportedSession, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> list[Event]:
    """Every event of one imported tree: its graph in parts, then one model call per invocation with usage."""
    return tree_events(imported, max_payload=max_payload).events


# --- publishing ----------------------------------------------------------------------------------


class Publisher(Protocol):
    async def publish_many(self, events: Sequence[Event], window: int = ...) -> list[PubAck]: ...


@dataclass
class PublishCounts:
    """What publishing did: events sent, how many the stream stored anew and how many it dropped as duplicates."""

    events: int = 0
    stored: int = 0
    duplicates: int = 0
    graph_parts: int = 0
    model_calls: int = 0

    def add(self, other: PublishCounts) -> None:
        self.events += other.events
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.graph_parts += other.graph_parts
        self.model_calls += other.model_calls


async def publish_events(publisher: Publisher, events: Sequence[Event], window: int = 256) -> PublishCounts:
    """Publish and wait for every PubAck; a duplicate ack means the stream already held that event."""
    acks = await publisher.publish_many(events, window=window)
    duplicates = sum(1 for ack in acks if ack.duplicate)
    return PublishCounts(
        events=len(events),
        stored=len(events) - duplicates,
        duplicates=duplicates,
        graph_parts=sum(1 for e in events if isinstance(e, TranscriptImported)),
        model_calls=sum(1 for e in events if isinstance(e, ModelCallCompleted)),
    )
